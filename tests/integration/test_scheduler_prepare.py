"""The scheduler's batch read-ahead (`Scheduler.prepare`), on real Postgres: a batch's submissions are
inserted in one statement and the jobs its other events name are locked and read in one, and the
handlers then leave what they would have left one event at a time, in the batch's order."""

from __future__ import annotations

from ibpool_proto import Message
from ibpool_proto.job import CancelJob, JobSpec, SubmitJob
from ibpool_proto.pool import ResourceRequest
from ibpool_runtime.clock import SystemClock
from ibpool_runtime.consumer import HandlerContext
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit
from ibpool_runtime.store import Store
from ibpool_scheduler import state
from ibpool_scheduler.config import SchedulerConfig
from ibpool_scheduler.service import Scheduler
from tests.integration.helpers import own_store


def submit(job_id: str, queue: str = "q") -> SubmitJob:
    spec = JobSpec(name=job_id, tenant="t", queue=queue, request=ResourceRequest(kind="whole", gpus_per_host=1))
    return SubmitJob(source="test", key=job_id, job_id=job_id, spec=spec)


def cancel(job_id: str) -> CancelJob:
    return CancelJob(source="test", key=job_id, job_id=job_id, reason="test")


async def handle(sched: Scheduler, store: Store, batch: list[Message]) -> dict[str, object]:
    """One batch as the consumer's fast path runs it: prepare, then each handler, one commit."""
    async with store.transaction() as tx:
        await sched.prepare(batch, tx)
        scratch = {k: dict(v) for k, v in tx.scratch.items()}
        for m in batch:
            await sched.on_news(m, HandlerContext(tx, "test", 1, {}, "test"))
    return scratch


async def queued_events(store: Store) -> list[str]:
    rows = await store.pool.fetch(
        "SELECT subject FROM outbox WHERE subject LIKE 'ibpool.job.job.queued.%' ORDER BY seq"
    )
    return [r["subject"].rsplit(".", 1)[1] for r in rows]


async def test_a_batch_read_ahead_keeps_the_order_of_its_events(stack: StackInfo) -> None:
    async with own_store(stack) as store:
        await store.migrate(state.MIGRATIONS)
        cfg = SchedulerConfig(instance="prepare", queues=["q"], predict_runtime=False)
        sched = Scheduler(
            Kit(name="scheduler", config=cfg, bus=None, store=store, metrics=ServiceMetrics("s")), SystemClock()
        )  # type: ignore[arg-type]
        await handle(sched, store, [submit("held")])
        batch: list[Message] = [
            submit("a"),
            submit("a"),  # the same job again (a retried command): one job, one JobQueued
            cancel("b"),  # before b exists: nothing to cancel, then b is submitted
            submit("b"),
            submit("c", queue="elsewhere"),  # not served here: not accepted
            submit("d"),
            cancel("held"),
            cancel("held"),  # the second sees the first's change, not the row read ahead
        ]
        scratch = await handle(sched, store, batch)
        # Only d went in the one insert (a is named twice, b also by a cancel, c is refused); the others
        # were locked and read ahead (a, b and c as missing).
        assert list(scratch[state.INSERTED]) == ["d"]
        assert sorted(scratch[state.AHEAD]) == ["a", "b", "c", "held"]
        assert scratch[state.AHEAD]["a"] is None and scratch[state.AHEAD]["held"] is not None
        states = {j: (await state.get_job(store.pool, j)) for j in ("a", "b", "c", "d", "held")}
        assert {j: r.state if r else None for j, r in states.items()} == {
            "a": "queued",
            "b": "queued",
            "c": None,
            "d": "queued",
            "held": "cancelled",
        }
        assert sorted(await queued_events(store)) == ["a", "b", "d", "held"]
        finished = await store.pool.fetch("SELECT subject FROM outbox WHERE subject LIKE 'ibpool.job.job.finished.%'")
        assert [r["subject"] for r in finished] == ["ibpool.job.job.finished.held"], "cancelled once"
