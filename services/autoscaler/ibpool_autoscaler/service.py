"""The autoscaler: metric and job news -> its records; every `interval_s`, one decision per deployment.

Handlers (every replica, durable transactional consumers) keep the records in step: a
`DeploymentMetricsReported` becomes a sample of its deployment; the scheduler's and agents' news of a
replica job moves the replica (JobScheduled: placed; JobStarted on every host it spans: ready;
JobRequeued: starting again, it lost its GPUs; JobFinished: gone, so the next decision replaces it if
the load still needs it), by the rule replicas and elastic workers share (`members.py`).

The control loop (the elected leader only) decides with the pure `ibpool_core.scale.policies.decide`
on the stored samples, replicas and the scaler's memory, and writes in one transaction per deployment
the new replicas, the removed ones, the memory and the decision, with the SubmitJob/CancelJob commands
and the ScaleDecided event in the outbox. A restart therefore resumes from exactly what was committed:
no replica is submitted twice, none is forgotten. The deployment's row is locked for the decision, so
a PUT or DELETE landing meanwhile waits, and a second replica deciding by mistake (a deposed leader)
decides on the first one's result rather than beside it.

Batch elasticity (`elastic.py`) runs in the same loop: every job's JobQueued/JobScheduled/JobRequeued/
JobFinished keeps `job_demand` (what waits at the scheduler), the worker jobs' news moves the workers,
and after the deployments the leader plans every elastic job in one transaction, on the idle GPUs of
its pool ledger replica (`ibpool_runtime.ledger_replica`) and the waiting work.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import asyncpg
import msgspec
from prometheus_client import Counter

from ibpool_core.clock import Clock
from ibpool_core.scale.model import ScalingReply, ScalingRequest
from ibpool_core.scale.policies import decide
from ibpool_proto import Message
from ibpool_proto.job import CancelJob, JobFinished, JobQueued, JobRequeued, JobScheduled, JobStarted
from ibpool_proto.scale import DeploymentMetricsReported
from ibpool_runtime.consumer import HandlerContext, Subscription
from ibpool_runtime.leader import Leadership
from ibpool_runtime.ledger_replica import LedgerReplica
from ibpool_runtime.logs import get_logger
from ibpool_runtime.outages import OUTAGES
from ibpool_runtime.service import Kit
from ibpool_runtime.store import Transaction

from . import state
from .config import AutoscalerConfig
from .declared import B, D, Kind
from .deployments import (
    Decision,
    InvalidDeployment,
    ReplicaRecord,
    core_deployment,
    decision_messages,
    policy_of,
    sample_of,
)
from .elastic import (
    JobPlan,
    Resize,
    RoundInput,
    WorkerRecord,
    plan_messages,
    plan_round,
)
from .members import GONE, M, MemberNews, after_news
from .pool_view import idle_gpus, jobs_holding_gpus

log = get_logger(__name__)

# What one deployment's decision survives: the store away, or a bad record (a stored row that no
# longer decodes: msgspec's errors are ValueErrors; a declaration the core or this version refuses:
# ValueError, InvalidDeployment for a policy no longer known).
DECISION_FAILURES: tuple[type[Exception], ...] = (*OUTAGES, ValueError, InvalidDeployment)
# What a round over all elastic jobs survives: the store away, or a stored job that no longer decodes.
ROUND_FAILURES: tuple[type[Exception], ...] = (*OUTAGES, ValueError)
JOB_NEWS = (JobQueued, JobScheduled, JobStarted, JobRequeued, JobFinished)
METRIC_NEWS = (DeploymentMetricsReported,)


class Autoscaler:
    def __init__(self, kit: Kit[AutoscalerConfig], clock: Clock, pool_from_seq: int | None = None) -> None:
        self.kit = kit
        self.cfg = cfg = kit.config
        self.clock = clock
        self.leadership: Leadership | None = None
        if cfg.leader_election:
            self.leadership = Leadership(kit.bus, cfg.leader_key, kit.source, cfg.leader_ttl_s, cfg.stream_replicas)
        # Set by a PUT: decide soon rather than at the next tick.
        self.wake = asyncio.Event()
        self.rounds = 0
        registry = kit.metrics.registry
        self.decisions = Counter(
            "ibpool_autoscaler_decisions", "Decisions that changed a replica count", ["direction"], registry=registry
        )
        self.samples = Counter("ibpool_autoscaler_samples", "Metric samples stored", registry=registry)
        self.resizes = Counter(
            "ibpool_autoscaler_elastic_resizes", "Elastic job resizes", ["direction"], registry=registry
        )
        # The pool ledger, for elasticity: idle GPUs, and which jobs hold GPUs.
        self.pool = LedgerReplica(kit.bus, pool_from_seq, metrics=kit.metrics)
        self.elastic_rounds = 0

    # -- news ---------------------------------------------------------------------------------

    def subscriptions(self) -> list[Subscription]:
        p = self.cfg.durable_prefix

        def sub(name: str, types: tuple[type[Message], ...]) -> Subscription:
            return Subscription(f"{p}-{name}", tuple(t.subject_pattern() for t in types), self.on_news)

        return [sub("jobs", JOB_NEWS), sub("metrics", METRIC_NEWS)]

    async def on_news(self, message: object, ctx: HandlerContext) -> None:
        assert ctx.tx is not None
        conn, now = ctx.tx.conn, self.clock.now()
        match message:
            case DeploymentMetricsReported():
                if await state.DEPLOYMENTS.get(conn, message.deployment) is None:
                    return  # not ours (yet): samples of unknown names would pile up unbounded
                await state.add_sample(conn, message.deployment, sample_of(message))
                self.samples.inc()
            case JobQueued() | JobScheduled() | JobStarted() | JobRequeued() | JobFinished():
                await self.on_demand_news(conn, message)
                if isinstance(message, JobQueued):
                    return
                replica = await state.REPLICAS.lock(conn, message.job_id)
                if replica is not None:
                    await self.on_member_news(conn, state.REPLICAS, replica, message, now)
                    return
                worker = await state.WORKERS.lock(conn, message.job_id)
                if worker is not None:  # else: neither ours, or one we already cancelled
                    await self.on_member_news(conn, state.WORKERS, worker, message, now)

    async def on_demand_news(
        self, conn: asyncpg.Connection, ev: JobQueued | JobScheduled | JobStarted | JobRequeued | JobFinished
    ) -> None:
        """What waits at the scheduler: queued (and requeued) jobs until they are scheduled or finish."""
        match ev:
            case JobQueued():
                await state.job_queued(conn, ev.job_id, ev.gpus, ev.priority)
            case JobScheduled():
                await state.job_waiting(conn, ev.job_id, False)
            case JobRequeued():
                await state.job_waiting(conn, ev.job_id, True)
            case JobFinished():
                await state.job_finished(conn, ev.job_id)
            case JobStarted():
                pass

    async def on_member_news(
        self, conn: asyncpg.Connection, members: state.MemberJobs[M], member: M, ev: MemberNews, now: dt.datetime
    ) -> None:
        """A replica's or a worker's job moved (see members.py); one that ended by itself is dropped: the
        next decision or round brings its owner back to what it needs."""
        changed = after_news(member, ev, now)
        if changed == GONE:
            assert isinstance(ev, JobFinished)
            log.info("member job ended", job_id=member.job_id, state=ev.state, reason=ev.reason)
            await members.delete(conn, [member.job_id])
        elif changed is not None:
            await members.update(conn, changed)

    # -- the API's writes -------------------------------------------------------------------------

    async def declare(self, tx: Transaction, kind: Kind[B, D, Any, Any], name: str, body: B) -> tuple[D, bool]:
        """Create or replace a deployment or an elastic job (checked by the caller); its members and what
        it remembers are kept (the next decision or round applies the new body). Returns the record and
        whether it is new."""
        now = self.clock.now()
        old = await kind.declarations.lock(tx.conn, name)
        if old is None:
            record = kind.record(name=name, body=body, created_at=now, updated_at=now)
        else:
            record = msgspec.structs.replace(old, body=body, updated_at=now)
        await kind.declarations.save(tx.conn, record)
        self.wake.set()
        return record, old is None

    async def withdraw(self, tx: Transaction, kind: Kind[Any, Any, Any, Any], name: str) -> list[str] | None:
        """Remove a deployment or an elastic job and cancel its member jobs (their ids); None when there is none."""
        if await kind.declarations.lock(tx.conn, name) is None:
            return None
        ids = [m.job_id for m in await kind.members.of(tx.conn, name)]
        await kind.members.delete(tx.conn, ids)
        await kind.forget(tx.conn, name)
        reason = f"{kind.noun} {name} deleted"
        await tx.outbox(*(CancelJob(source=self.kit.source, key=i, job_id=i, reason=reason) for i in ids))
        self.wake.set()
        return ids

    # -- decisions ------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.leadership is None or self.leadership.is_leader

    async def decide_all(self) -> dict[str, ScalingReply]:
        """One decision per deployment, each in its own transaction (one failing leaves the others)."""
        now = self.clock.now()
        await state.prune_samples(self.kit.store.pool, now - dt.timedelta(seconds=self.cfg.metric_retention_s))
        replies: dict[str, ScalingReply] = {}
        for name in await state.DEPLOYMENTS.names(self.kit.store.pool):
            try:
                reply = await self.decide_one(name)
            except DECISION_FAILURES as e:  # a store hiccup or a bad record must not stop the other deployments
                self.kit.metrics.loop_failed("scaling decision", e)
                log.warning("scaling decision failed", deployment=name, error=str(e) or type(e).__name__)
                continue
            if reply is not None:
                replies[name] = reply
        self.rounds += 1
        return replies

    async def decide_one(self, name: str) -> ScalingReply | None:
        async with self.kit.store.transaction() as tx:
            record = await state.DEPLOYMENTS.lock(tx.conn, name)
            if record is None:
                return None  # deleted meanwhile
            now = self.clock.now()
            replicas = await state.REPLICAS.of(tx.conn, name)
            since = now - dt.timedelta(seconds=self.cfg.metric_retention_s)
            request = ScalingRequest(
                deployment=core_deployment(name, record.body),
                replicas=[r.core() for r in replicas],
                metrics=await state.samples_since(tx.conn, name, since),
                now=now,
                policy=policy_of(record.body),
                memory=record.memory,
            )
            reply = decide(request)
            new_ids = await state.REPLICAS.next_ids(tx.conn, name, reply.add)
            await state.REPLICAS.insert(
                tx.conn,
                [
                    ReplicaRecord(
                        job_id=i,
                        deployment=name,
                        state="starting",
                        since=now,
                        submitted_at=now,
                        hosts=record.body.hosts,
                    )
                    for i in new_ids
                ],
            )
            if reply.remove:
                await state.REPLICAS.delete(tx.conn, list(reply.remove))
            decision = Decision(
                at=now,
                current=len(replicas),
                desired=reply.desired_replicas,
                recommended=reply.recommended,
                reason=reply.reason,
                forecast_requests_per_s=reply.forecast_requests_per_s,
            )
            await state.DEPLOYMENTS.save(tx.conn, msgspec.structs.replace(record, memory=reply.memory, last=decision))
            await tx.outbox(
                *decision_messages(record, reply, len(replicas), new_ids, self.kit.source, self.cfg.replica_runtime_s)
            )
        if reply.desired_replicas != len(replicas):
            direction = "up" if reply.desired_replicas > len(replicas) else "down"
            self.decisions.labels(direction).inc()
            log.info(
                "scaled",
                deployment=name,
                current=len(replicas),
                desired=reply.desired_replicas,
                reason=reply.reason,
            )
        return reply

    async def decide_elastic(self) -> list[JobPlan] | None:
        """One elasticity round over every elastic job, in one transaction; None when the ledger replica
        has not caught up yet (idle GPUs would be wrong) or no elastic job is declared."""
        if not self.pool.caught_up:
            return None
        async with self.kit.store.transaction() as tx:
            jobs = await state.ELASTIC_JOBS.lock_all(tx.conn)
            if not jobs:
                return None
            ledger = self.pool.ledger
            inp = RoundInput(
                jobs=jobs,
                workers=await state.WORKERS.by_owner(tx.conn),
                free_gpus=idle_gpus(ledger),
                placed=frozenset(jobs_holding_gpus(ledger)),
                waiting=await state.waiting_jobs(tx.conn),
            )
            plans = plan_round(inp)
            now = self.clock.now()
            by_name = {j.name: j for j in jobs}
            out: list[Message] = []
            for plan in plans:
                record = by_name[plan.name]
                new_ids = await state.WORKERS.next_ids(tx.conn, plan.name, plan.add)
                await state.WORKERS.insert(
                    tx.conn,
                    [
                        WorkerRecord(job_id=i, elastic_job=plan.name, state="queued", since=now, submitted_at=now)
                        for i in new_ids
                    ],
                )
                if plan.cancel:
                    await state.WORKERS.delete(tx.conn, plan.cancel)
                    for job_id in plan.cancel:  # no longer waiting work of anyone's
                        await state.job_finished(tx.conn, job_id)
                resize = Resize(at=now, workers_from=plan.workers_from, workers_to=plan.workers_to, reason=plan.reason)
                await state.ELASTIC_JOBS.save(tx.conn, msgspec.structs.replace(record, last=resize))
                out += plan_messages(record, plan, new_ids, self.kit.source, self.cfg.replica_runtime_s)
            await tx.outbox(*out)
        self.elastic_rounds += 1
        for plan in plans:
            if plan.workers_to != plan.workers_from:
                self.resizes.labels("up" if plan.workers_to > plan.workers_from else "down").inc()
            log.info(
                "elastic job resized",
                elastic_job=plan.name,
                workers_from=plan.workers_from,
                workers_to=plan.workers_to,
                reason=plan.reason,
            )
        return plans

    # -- loops ----------------------------------------------------------------------------------

    async def leader_loop(self, stop: asyncio.Event) -> None:
        if self.leadership is not None:
            await self.leadership.run(stop)

    async def control_loop(self, stop: asyncio.Event) -> None:
        """Decide every `interval_s`, and soon after a deployment is created or changed."""
        while not stop.is_set():
            waits = [asyncio.ensure_future(e.wait()) for e in (self.wake, stop)]
            try:
                await asyncio.wait(waits, timeout=self.cfg.interval_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            if stop.is_set():
                break
            self.wake.clear()
            if not self.is_leader:
                continue
            try:
                await self.decide_all()
            except OUTAGES as e:  # the store down for a moment: try again at the next tick
                self.kit.metrics.loop_failed("scaling round", e)
                log.warning("scaling round failed", error=str(e) or type(e).__name__)
            try:
                await self.decide_elastic()
            except ROUND_FAILURES as e:  # the store down, or a stored elastic job that no longer decodes
                self.kit.metrics.loop_failed("elasticity round", e)
                log.warning("elasticity round failed", error=str(e) or type(e).__name__)

    async def pool_loop(self, stop: asyncio.Event) -> None:
        await self.pool.run(stop)
