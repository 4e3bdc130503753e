"""Batch elasticity's glue without a bus or database: one round over declared elastic jobs, their workers, the
pool's free GPUs and the waiting work, and what it sends."""

from __future__ import annotations

import datetime as dt

import msgspec
import pytest

from ibpool_autoscaler.elastic import (
    ElasticJobBody,
    ElasticJobRecord,
    InvalidElasticJob,
    JobPlan,
    RoundInput,
    Waiting,
    WorkerRecord,
    check_body,
    elastic_view,
    plan_messages,
    plan_round,
)
from ibpool_autoscaler.pool_view import idle_gpus, jobs_holding_gpus
from ibpool_core.pool.ledger import Allocation, Gpu, Ledger, Node
from ibpool_proto.job import CancelJob, SubmitJob
from ibpool_proto.scale import ElasticJobResized

T0 = dt.datetime(2026, 12, 1, 14, 0, tzinfo=dt.UTC)


def job(name: str = "train", **fields: object) -> ElasticJobRecord:
    body = msgspec.convert({"tenant": "research", "max_workers": 8, **fields}, ElasticJobBody)
    return ElasticJobRecord(name=name, body=body, created_at=T0, updated_at=T0)


def workers(name: str, count: int, first: int = 1) -> list[WorkerRecord]:
    return [
        WorkerRecord(
            job_id=f"{name}-w{n}",
            elastic_job=name,
            state="running",
            since=T0,
            submitted_at=T0 + dt.timedelta(seconds=n),
        )
        for n in range(first, first + count)
    ]


def one_round(
    jobs: list[ElasticJobRecord],
    live: dict[str, list[WorkerRecord]],
    free: int,
    *,
    unplaced: set[str] = frozenset(),  # type: ignore[assignment]
    waiting: list[Waiting] = [],  # noqa: B006 (never mutated)
) -> dict[str, JobPlan]:
    placed = frozenset(w.job_id for ws in live.values() for w in ws if w.job_id not in unplaced)
    plans = plan_round(RoundInput(jobs=jobs, workers=live, free_gpus=free, placed=placed, waiting=waiting))
    return {p.name: p for p in plans}


def test_grows_into_idle_gpus_up_to_max_workers() -> None:
    plans = one_round([job(max_workers=4)], {"train": workers("train", 1)}, free=16)
    assert plans["train"].add == 3 and plans["train"].cancel == []
    assert (plans["train"].workers_from, plans["train"].workers_to) == (1, 4)
    assert "grown into 3 idle GPUs" in plans["train"].reason


def test_whole_workers_only_and_unplaced_workers_count_as_taking_their_gpus() -> None:
    # 2 GPUs per worker; 5 free GPUs of which 2 go to the unplaced worker: one more worker fits.
    live = {"train": workers("train", 2)}
    plans = one_round([job(gpus_per_worker=2)], live, free=5, unplaced={"train-w2"})
    assert plans["train"].add == 1


def test_nothing_changes_when_no_gpu_is_idle() -> None:
    assert one_round([job()], {"train": workers("train", 3)}, free=0) == {}


def test_unplaced_workers_beyond_the_free_gpus_are_withdrawn_newest_first_never_below_min() -> None:
    live = {"train": workers("train", 4)}
    plans = one_round([job(min_workers=2)], live, free=1, unplaced={"train-w2", "train-w3", "train-w4"})
    # 3 unplaced workers, 1 free GPU: 2 cannot start and are withdrawn, the newest first.
    assert plans["train"].cancel == ["train-w4", "train-w3"] and plans["train"].add == 0
    assert "2 unplaced workers withdrawn" in plans["train"].reason
    floor = one_round([job(min_workers=4)], live, free=1, unplaced={"train-w2", "train-w3", "train-w4"})
    assert floor == {}


def test_shrinks_newest_workers_for_higher_priority_work_and_not_below_min() -> None:
    live = {"train": workers("train", 8)}
    urgent = [Waiting(job_id="eval", gpus=4, priority=10)]
    plans = one_round([job(min_workers=2)], live, free=0, waiting=urgent)
    assert plans["train"].cancel == ["train-w8", "train-w7", "train-w6", "train-w5"]
    assert plans["train"].workers_to == 4 and "shrunk for higher-priority eval" in plans["train"].reason
    # Too big to free for: shrinking to the minimum would not cover it, so nothing is shrunk.
    assert one_round([job(min_workers=6)], live, free=0, waiting=urgent) == {}


def test_work_of_its_own_priority_is_not_shrunk_for_and_keeps_it_from_growing() -> None:
    live = {"train": workers("train", 2)}
    peer = [Waiting(job_id="other", gpus=8, priority=0)]
    assert one_round([job()], live, free=4, waiting=peer) == {}
    # Lower-priority work gets the idle GPUs it asks for first; the rest is grown into.
    low = [Waiting(job_id="batch", gpus=3, priority=-5)]
    assert one_round([job()], live, free=4, waiting=low)["train"].add == 1


def test_its_own_queued_workers_are_not_waiting_work() -> None:
    live = {"train": workers("train", 2)}
    own = [Waiting(job_id="train-w2", gpus=1, priority=0)]
    assert one_round([job()], live, free=3, waiting=own, unplaced={"train-w2"})["train"].add == 2


def test_bounds_first_below_min_submitted_above_max_cancelled_newest_first() -> None:
    plans = one_round([job(min_workers=3)], {"train": workers("train", 1)}, free=0)
    assert plans["train"].add == 2 and "up to min_workers 3" in plans["train"].reason
    plans = one_round([job(max_workers=2)], {"train": workers("train", 5)}, free=10)
    assert plans["train"].cancel == ["train-w5", "train-w4", "train-w3"] and plans["train"].add == 0


def test_a_lower_priority_job_gives_back_first() -> None:
    jobs = [job("low", priority=0), job("mid", priority=5)]
    live = {"low": workers("low", 4), "mid": workers("mid", 4)}
    plans = one_round(jobs, live, free=0, waiting=[Waiting(job_id="urgent", gpus=2, priority=9)])
    assert list(plans) == ["low"] and plans["low"].cancel == ["low-w4", "low-w3"]


def test_a_round_sends_the_resize_the_new_workers_and_the_cancellations() -> None:
    rec = job(priority=3, gpus_per_worker=2, queue="train")
    plan = JobPlan(name="train", workers_from=3, workers_to=4, add=2, cancel=["train-w3"], reason="r")
    msgs = plan_messages(rec, plan, ["train-w4", "train-w5"], "autoscaler-1", 3600.0)
    resized, *rest = msgs
    assert isinstance(resized, ElasticJobResized)
    assert (resized.workers_from, resized.workers_to, resized.submitted, resized.cancelled) == (
        3,
        4,
        ["train-w4", "train-w5"],
        ["train-w3"],
    )
    submits = [m for m in rest if isinstance(m, SubmitJob)]
    assert [s.job_id for s in submits] == ["train-w4", "train-w5"]
    spec = submits[0].spec
    assert (spec.request.kind, spec.request.gpus_per_host, spec.priority, spec.queue, spec.tenant) == (
        "whole",
        2,
        3,
        "train",
        "research",
    )
    assert spec.workload is not None and spec.workload.simulated_runtime_s == 3600.0
    assert [m.job_id for m in rest if isinstance(m, CancelJob)] == ["train-w3"]


def test_bodies_that_do_not_add_up_name_the_field() -> None:
    with pytest.raises(InvalidElasticJob) as e:
        check_body(job(min_workers=9).body)
    assert e.value.path == "$.min_workers"
    with pytest.raises(msgspec.ValidationError, match=r"\$.gpus_per_worker"):
        msgspec.convert({"tenant": "t", "max_workers": 2, "gpus_per_worker": 0}, ElasticJobBody)
    with pytest.raises(msgspec.ValidationError, match="max_workers"):
        msgspec.convert({"tenant": "t"}, ElasticJobBody)


def test_view_counts_queued_and_running_workers() -> None:
    live = workers("train", 3)
    live[2] = msgspec.structs.replace(live[2], state="queued")
    view = elastic_view(job(), list(reversed(live)))
    assert (view.workers.queued, view.workers.running) == (1, 2)
    assert [w.job_id for w in view.worker_jobs] == ["train-w1", "train-w2", "train-w3"]


def test_idle_gpus_are_free_whole_ready_gpus_of_ready_nodes() -> None:
    def gpu(i: int, **f: object) -> Gpu:
        return Gpu(index=i, uuid=f"G{i}", model="H100", memory_mib=80_000, **f)  # type: ignore[arg-type]

    ledger = Ledger()
    ledger.nodes["a"] = Node(
        node_id="a",
        gpus=(gpu(0), gpu(1, granted_milli=1000, holders=("x",)), gpu(2, granted_milli=500), gpu(3, cordoned=True)),
    )
    ledger.nodes["b"] = Node(node_id="b", gpus=(gpu(0), gpu(1)), cordoned=True)
    assert idle_gpus(ledger) == 1
    ledger.allocations["x"] = Allocation(
        allocation_id="x",
        command_id="c",
        job_id="job-1",
        tenant="t",
        queue="q",
        kind="whole",
        nodes=("a",),
        grants=(),
        lease_expires_at=T0,
    )
    assert jobs_holding_gpus(ledger) == {"job-1"}
