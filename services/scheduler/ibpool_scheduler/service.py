"""The scheduler: job and allocation news -> job records; on a timer and on news, one cycle -> proposals out.

Handlers (every replica, durable transactional consumers) keep the job records in step with what
happened: submissions and cancellations, the allocator's answers (granted, rejected), lost
allocations (revoked, expired, requeue requested by the failover controller) and the node agents'
starts and exits. They decide nothing: each locks the job's row, asks the core
(`ibpool_core.sched.lifecycle.decide`), saves the record it returns and queues its events.

The cycle (the elected leader only) reads the live jobs, builds the pool from its ledger replica
(`ibpool_runtime.ledger_replica`), decides with `ibpool_core.sched.cycle.schedule` (`plan.py`) and writes, in one
transaction, the jobs' new states and every event of the cycle to the outbox: all proposals of the
cycle leave in one commit. The transaction takes the cycle lock and checks the leader's term
against the stored fence, and every proposal carries the term, so a deposed leader that has not
noticed yet can neither commit a cycle nor get a placement granted. A job's row is written only if
it is still what the cycle read (compared whole), so a cancellation or an answer that lands during
the cycle wins and the cycle's events for that job are dropped with it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from prometheus_client import Counter, Histogram

from ibpool_core.clock import Clock
from ibpool_core.fabric.view import FabricState, FabricView
from ibpool_core.sched import lifecycle
from ibpool_core.sched import records as jobs
from ibpool_core.sched.book import LiveBook
from ibpool_core.sched.cycle import CycleConfig
from ibpool_core.sched.fairshare import FairShareState, accrue, fairshare_factors, seeded_usage
from ibpool_core.sched.framework import Framework, Telemetry, build_profile
from ibpool_core.sched.pool_cycle import (
    CyclePlan,
    LeafSource,
    LeaseWatch,
    PlacementInputs,
    PlanCache,
    ProposalStamp,
    QueueRule,
    job_changes,
    leases_due,
    plan_cycle,
)
from ibpool_core.sched.profiles import SCHEDULER_PROFILE
from ibpool_core.sched.queueing import QueuePolicy, make_policy
from ibpool_core.sched.records import JobRecord, record_from_spec
from ibpool_proto import Message
from ibpool_proto.health import RequeueRequested
from ibpool_proto.job import (
    CancelJob,
    JobExited,
    JobQueued,
    JobScheduled,
    JobSpec,
    JobStarted,
    SubmitJob,
)
from ibpool_proto.pool import (
    AllocationExpired,
    AllocationGranted,
    AllocationRejected,
    AllocationRevoked,
    PlacementItem,
    ProposePlacement,
    ProposePlacements,
    RenewLease,
)
from ibpool_runtime.config import ConfigError
from ibpool_runtime.consumer import HandlerContext, HandlerFailed, Handoff, Subscription
from ibpool_runtime.fabric_feed import FabricFeed, load_fabric_file
from ibpool_runtime.leader import Leadership
from ibpool_runtime.ledger_replica import LedgerReplica
from ibpool_runtime.logs import get_logger
from ibpool_runtime.outages import OUTAGES
from ibpool_runtime.service import Kit
from ibpool_runtime.store import Transaction

from . import members, state
from .config import SchedulerConfig
from .job_metrics import WAIT_BUCKETS, JobCounts, JobsCollector, count_jobs
from .node_feed import NodeFeed, PlacementTelemetry
from .predictor import RuntimePredictor, estimates_of, settings_of

log = get_logger(__name__)

JOB_NEWS = (SubmitJob, CancelJob, JobStarted, JobExited)
POOL_NEWS = (AllocationGranted, AllocationRejected, AllocationRevoked, AllocationExpired)
HEALTH_NEWS = (RequeueRequested,)
# The scheduler's consumers (durable `<durable_prefix>-<name>`) and what each takes.
NEWS: dict[str, tuple[type[Message], ...]] = {"jobs": JOB_NEWS, "pool": POOL_NEWS, "health": HEALTH_NEWS}
# `Transaction.scratch` key: this transaction is a cycle's, handling job news before it plans.
IN_CYCLE = "scheduler.in_cycle"

# The placement profile the scheduler runs unless `placement_profile` says otherwise (shared with the sim).
DEFAULT_PROFILE: dict[str, Any] = SCHEDULER_PROFILE

CONDITIONAL_UPDATE = (
    "UPDATE jobs SET state = u.state, updated_at = $1, body = u.body"
    " FROM unnest($2::text[], $3::text[], $4::text[], $5::text[]) AS u(job_id, old_body, state, body)"
    " WHERE jobs.job_id = u.job_id AND jobs.body = u.old_body RETURNING jobs.job_id"
)


class Every:
    """Calling it says whether `period_s` (monotonic clock) has passed since it last said yes; `now()`
    makes the next call say yes."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self._last = -math.inf

    def __call__(self) -> bool:
        clock = time.monotonic()
        if clock - self._last < self.period_s:
            return False
        self._last = clock
        return True

    def now(self) -> None:
        self._last = -math.inf


class IdTaken(msgspec.Struct, frozen=True, kw_only=True):
    """A submission under the id of another job: what differs (`field: stored -> asked`)."""

    job_id: str
    differences: list[str]

    def text(self) -> str:
        return f"job id {self.job_id} is taken by a different job: " + "; ".join(self.differences)


class Scheduler:
    def __init__(self, kit: Kit[SchedulerConfig], clock: Clock, pool_from_seq: int | None = None) -> None:
        self.kit = kit
        self.cfg = cfg = kit.config
        self.clock = clock
        try:
            self.policy: QueuePolicy = make_policy(cfg.policy)
        except KeyError as e:
            raise ConfigError(f"invalid scheduler config: field `policy`: {e.args[0]}") from None
        self.cycle_config = CycleConfig(
            backfill=cfg.backfill, scan_depth=cfg.scan_depth, span_relax_after_s=cfg.span_relax_after_s
        )
        self.queue_rules: dict[str, QueueRule] = {}
        for queue, qc in cfg.queue_policies.items():
            try:
                policy = make_policy(qc.policy) if qc.policy is not None else self.policy
            except KeyError as e:
                raise ConfigError(
                    f"invalid scheduler config: field `queue_policies.{queue}.policy`: {e.args[0]}"
                ) from None
            backfill = qc.backfill if qc.backfill is not None else cfg.backfill
            self.queue_rules[queue] = (policy, msgspec.structs.replace(self.cycle_config, backfill=backfill))
        self.framework: Framework | None = None
        if cfg.placement == "framework":
            try:
                self.framework = Framework(build_profile({**DEFAULT_PROFILE, **cfg.placement_profile}))
            except ValueError as e:
                raise ConfigError(f"invalid scheduler config: field `placement_profile`: {e}") from None
        if cfg.placement_sample < 0:
            raise ConfigError("invalid scheduler config: field `placement_sample`: must be >= 0")
        # The dataset registry: the config's, plus what PUT /v1/datasets/{name} stored (refresh_datasets).
        self.datasets: dict[str, list[str]] = dict(cfg.datasets)
        self.datasets_version = 0
        self.fairshare = FairShareState()
        self.fairshare_factors: dict[str, float] = {}
        self.nodes = NodeFeed(kit.bus, kit.metrics)
        # The fabric placement decides on: the fabric monitor's published topology, followed live
        # (or `fabric_file` until one is published); the node labels only while neither is known.
        self.fabric = FabricView(
            load_fabric_file(cfg.fabric_file, cfg.fabric_format, service="scheduler") if cfg.fabric_file else None
        )
        self._mismatch_logged: FabricState | None = None
        self.fabric_feed = FabricFeed(
            kit, self.fabric, fetch_timeout_s=cfg.fabric_fetch_timeout_s, durable_prefix=cfg.durable_prefix
        )
        self._telemetry = PlacementTelemetry(cfg.telemetry_max_age_s)
        self.feed = LedgerReplica(kit.bus, pool_from_seq, metrics=kit.metrics)
        # Terms are only comparable within one election, so the fencing group defaults to its key.
        self.group = cfg.scheduler_group or cfg.leader_key
        self.lifecycle = lifecycle.LifecycleConfig(
            source=kit.source, max_attempts=cfg.max_attempts, retry_after_s=cfg.retry_after_s
        )
        self.leadership: Leadership | None = None
        if cfg.leader_election:
            self.leadership = Leadership(kit.bus, cfg.leader_key, kit.source, cfg.leader_ttl_s, cfg.stream_replicas)
        self.wake = asyncio.Event()
        # Per consumer (jobs, pool, health): the news the leader's next cycle handles in its own
        # transaction, for those `cycle_takes_news` names.
        unknown = sorted(set(cfg.cycle_takes_news) - set(NEWS))
        if unknown:
            raise ConfigError(
                f"invalid scheduler config: field `cycle_takes_news`: unknown {', '.join(map(repr, unknown))}"
                f" (known: {', '.join(NEWS)})"
            )
        self.news = {name: Handoff(functools.partial(self.takes_news, name), self.wake.set) for name in NEWS}
        self.last_plan: CyclePlan | None = None
        self.cycles = 0
        # Jobs the last cycle left queued: while none wait, a ledger change alone does not start a cycle.
        self.backlog = 0
        # What an unchanged node offers and an unchanged held job is, kept across cycles (plan.PlanCache).
        self.plan_cache = PlanCache()
        # The live jobs as the last cycle read them; each cycle reads only the rows changed since.
        self.live = state.LiveJobs()
        # Allocation id -> when its lease renewal was last sent (monotonic): one renewal in flight.
        self._renewed: dict[str, float] = {}
        self.lease_watch = LeaseWatch()
        # A look for leases to renew walks every live job: at most every `lease_s / 8`, and once a
        # second at most (a lease still has half its length left when it first becomes due).
        self.renewals_due = Every(min(1.0, cfg.lease_s / 8))
        # The dataset registry is read at most once a second (one another replica changed shows within
        # a second), and by the next cycle after a change through this replica (`datasets_changed`).
        self.datasets_due = Every(1.0)
        self._lock = asyncio.Lock()
        # The fencing term the last committed cycle recorded: a cycle of a new term commits durably,
        # so a crash of Postgres cannot take the fence back below a term that has proposed.
        self._fenced_term: int | None = None
        registry = kit.metrics.registry
        self.proposed = Counter("ibpool_scheduler_proposals", "Placements proposed", registry=registry)
        self.answers = Counter(
            "ibpool_scheduler_answers", "Allocator answers to proposals", ["outcome"], registry=registry
        )
        self.requeues = Counter("ibpool_scheduler_requeues", "Jobs requeued", ["cause"], registry=registry)
        self.news_in_cycles = Counter(
            "ibpool_scheduler_news_in_cycles",
            "News handled in a cycle's transaction (`cycle_takes_news`), by type",
            ["type"],
            registry=registry,
        )
        self.cycle_seconds = Histogram(
            "ibpool_scheduler_cycle_seconds",
            "Read live jobs, decide, write one cycle",
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
        )
        self.wait_seconds = Histogram(
            "ibpool_scheduler_wait_seconds",
            "How long a job waited from entering the queue (its submission or requeue) to its grant,"
            " observed at the grant",
            ["queue"],
            registry=registry,
            buckets=WAIT_BUCKETS,
        )
        registry.register(JobsCollector(self.job_counts))
        # The learned runtime model (predictor.py): predictions for the cycle, history for gittins-learned.
        self.predictor: RuntimePredictor | None = None
        if cfg.predict_runtime:
            try:
                self.predictor = RuntimePredictor(settings_of(cfg), clock=clock, registry=registry, metrics=kit.metrics)
            except ValueError as e:
                raise ConfigError(f"invalid scheduler config: {e}") from None
            self.predictor.attach([self.policy, *(rule[0] for rule in self.queue_rules.values())])

    # -- news ---------------------------------------------------------------------------------

    def subscriptions(self) -> list[Subscription]:
        p = self.cfg.durable_prefix

        def sub(name: str, types: tuple[type[Message], ...]) -> Subscription:
            return Subscription(
                f"{p}-{name}",
                tuple(t.subject_pattern() for t in types),
                self.on_news,
                prepare=self.prepare,
                handoff=self.news[name],
            )

        return [*(sub(name, types) for name, types in NEWS.items()), self.fabric_feed.subscription()]

    def takes_news(self, name: str) -> bool:
        """Whether the next cycle will handle news of consumer `name` fetched now: when the config
        says so, while this replica leads, caught up."""
        return name in self.cfg.cycle_takes_news and self.is_leader and self.feed.caught_up

    def wake_after(self, tx: Transaction) -> None:
        """Wake the cycle once `tx` commits; not when `tx` is a cycle's own, which plans with what it changed."""
        if not tx.scratch.get(IN_CYCLE):
            tx.after_commit(self.wake.set)

    def queue_policy_names(self, live: list[JobRecord]) -> dict[str, tuple[str, str]]:
        """queue -> (policy name, backfill) for every configured, served or live queue."""
        cfg = self.cfg
        queues = {*cfg.queue_policies, *cfg.queues, *(j.queue for j in live)}
        out: dict[str, tuple[str, str]] = {}
        for q in sorted(queues):
            rule = self.queue_rules.get(q)
            out[q] = (rule[0].name, rule[1].backfill) if rule is not None else (self.policy.name, cfg.backfill)
        return out

    def serves(self, queue: str) -> bool:
        return not self.cfg.queues or queue in self.cfg.queues

    async def on_news(self, message: object, ctx: HandlerContext) -> None:
        """Lock the job's row, let the core decide what the news does to it (`lifecycle.decide`),
        save that and queue its events. A submission is accepted (`accept`)."""
        assert ctx.tx is not None
        if isinstance(message, SubmitJob):
            accepted = await self.accept(ctx.tx, message.job_id, message.spec)
            if isinstance(accepted, str):
                log.info("submission not accepted", job_id=message.job_id, why=accepted)
            elif isinstance(accepted, IdTaken):
                log.warning("submission not accepted: its job id is taken", job_id=message.job_id, why=accepted.text())
            return
        assert isinstance(message, lifecycle.News)
        job = await state.lock_job(ctx.tx, message.job_id)
        await self.apply(ctx.tx, lifecycle.decide(job, message, self.clock.now(), self.lifecycle), message.job_id)

    async def apply(self, tx: Transaction, t: lifecycle.Transition, job_id: str) -> None:
        """Save what a transition changed and queue its events (one transaction), count it, log its
        note, and wake the cycle once it commits when it asks to."""
        if t.job is not None:
            await state.save_job(tx, t.job, self.clock.now())
        if t.events:
            await tx.outbox(*t.events)
        for counter, label in t.counts:
            (self.answers if counter == "answers" else self.requeues).labels(label).inc()
        for e in t.events:
            if isinstance(e, JobScheduled):  # granted: its wait as the core measured it, once committed
                tx.after_commit(functools.partial(self.wait_seconds.labels(e.queue).observe, e.waited_s))
        if t.note:
            log.info(t.note, job_id=job_id)
        if t.wake:
            self.wake_after(tx)

    async def prepare(self, batch: list[Message], tx: Transaction) -> None:
        """One statement for what the batch's handlers would each do alone: insert the submissions
        (those whose job no other event of the batch names, so the batch's order still holds) and
        lock and read the jobs the other events name."""
        named: dict[str, int] = {}
        for m in batch:
            job_id = getattr(m, "job_id", None)
            if isinstance(job_id, str):
                named[job_id] = named.get(job_id, 0) + 1
        now = self.clock.now()
        new: list[JobRecord] = []
        for m in batch:
            if isinstance(m, SubmitJob) and named[m.job_id] == 1:
                admitted = self.admit(m.job_id, m.spec, now)
                if not isinstance(admitted, str):
                    new.append(admitted)
        await state.insert_many(tx, new, now)
        inserted = {j.job_id for j in new}
        await state.lock_ahead(tx, [j for j in named if j not in inserted])

    def admit(self, job_id: str, spec: JobSpec, now: dt.datetime) -> JobRecord | str:
        """The job record of a submission this replica takes, or why it does not."""
        if not self.serves(spec.queue):
            return f"queue {spec.queue!r} is not served here (serving {', '.join(self.cfg.queues)})"
        record = record_from_spec(job_id, spec, now)
        if isinstance(record, str):
            return record
        if record.sites and self.framework is None:
            return 'a job naming sites needs the framework placement (`placement = "framework"`)'
        return record

    async def accept(self, tx: Transaction, job_id: str, spec: JobSpec) -> JobRecord | str | IdTaken:
        """Queue a new job (JobQueued). The same submission again returns the stored job; another
        one under a taken id is `IdTaken` (its differences); a bad spec, why."""
        done, stored = state.taken_insert(tx, job_id)  # inserted by `prepare` with its batch
        if done and stored is not None:
            record = stored
        else:
            now = self.clock.now()
            admitted = self.admit(job_id, spec, now)
            if isinstance(admitted, str):
                return admitted
            record = admitted
            if done or not await state.insert_job(tx.conn, record, now):
                held = await state.read_job(tx, job_id)
                if held is None:
                    return record
                differences = jobs.spec_differences(held, record)
                return IdTaken(job_id=job_id, differences=differences) if differences else held
        await tx.outbox(
            JobQueued(
                source=self.kit.source,
                key=job_id,
                job_id=job_id,
                tenant=record.tenant,
                queue=record.queue,
                priority=record.priority,
                gpus=record.gpus,
                hosts=record.hosts,
            )
        )
        self.wake_after(tx)
        return record

    async def cancel(self, tx: Transaction, job_id: str, reason: str) -> JobRecord | None:
        """End a live job (its allocation released); an ended job is returned unchanged."""
        job = await state.lock_job(tx, job_id)
        news = CancelJob(source=self.kit.source, key=job_id, job_id=job_id, reason=reason)
        t = lifecycle.decide(job, news, self.clock.now(), self.lifecycle)
        await self.apply(tx, t, job_id)
        return t.job if t.job is not None else job

    # -- the cycle ------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.leadership is None or self.leadership.is_leader

    def job_counts(self) -> JobCounts | None:
        """The live jobs as the last cycle read them, summarised for /metrics; None unless this replica
        leads and has read them since (a standby's cycles read nothing, so its picture goes stale)."""
        if not self.is_leader or not self.live.current:
            return None
        queues = {*self.cfg.queues, *self.cfg.queue_policies}
        return count_jobs(self.live.by_id.values(), self.clock.now(), queues)

    async def cycle_once(self) -> CyclePlan | None:
        """One scheduling decision, committed; None when not leading, not caught up, or fenced."""
        if not self.is_leader or not self.feed.caught_up:
            await self.news_apart()  # fetched while this replica led: handled as any replica would
            if not self.is_leader and self.fairshare.updated_at:
                self.fairshare = FairShareState()  # leading again later starts from the history anew
                self.live.reset()  # and from a whole read of the live jobs
            return None
        async with self._lock:
            started = time.perf_counter()
            try:
                plan = await self._decide_and_commit()
            except BaseException:
                self.live.reset()  # what was read may be half taken in: read it whole next time
                raise
            if plan is not None:
                self.cycle_seconds.observe(time.perf_counter() - started)
                self.cycles += 1
                self.last_plan = plan
            return plan

    async def news_apart(self) -> None:
        """Handle the news kept for cycles apart, as without the hand-off."""
        for handoff in self.news.values():
            if handoff.kept:
                await handoff.handle_apart(handoff.take())

    async def _decide_and_commit(self) -> CyclePlan | None:
        taken: list[tuple[Handoff, list[Any]]] = []  # the news this cycle took: acked once it committed
        try:
            plan = await self._decide_and_commit_with(taken)
        except Exception as e:
            # Any error, to clean up, not to survive: nothing of the news was committed, so it is
            # handled apart (one event at a time, a failing one nak'd, counted in ibpool_events_failed)
            # and the error raised again; only HandlerFailed (one of its handlers failed) ends here,
            # and the cycle runs again without that news.
            for handoff, news in taken:
                await handoff.handle_apart(news)
            if isinstance(e, HandlerFailed):
                self.wake.set()
                return None
            raise
        for handoff, news in taken:
            await handoff.settle(news)
            for o in news:
                self.news_in_cycles.labels(type(o.event).__name__).inc()
        if plan is None:  # not this replica's turn (locked out, fenced)
            await self.news_apart()
        return plan

    async def _decide_and_commit_with(self, taken: list[tuple[Handoff, list[Any]]]) -> CyclePlan | None:
        term = self.leadership.term if self.leadership is not None else None
        if self.leadership is not None and term is None:
            self.leadership.step_down("no term to schedule with")
            return None
        # Known before the lock: news kept now will be taken (acked after the commit), a new term's fence.
        durable = term != self._fenced_term or any(h.kept for h in self.news.values())
        async with self.kit.store.transaction() as tx:
            match await state.lock_cycle(tx.conn, self.kit.store.schema, term, durable=durable):
                case "busy":
                    return None
                case "fenced":
                    assert self.leadership is not None
                    self.leadership.step_down("a newer leader has scheduled (fenced)")
                    return None
            taken.extend((h, news) for h in self.news.values() if (news := h.take()))
            tx.scratch[IN_CYCLE] = True
            for handoff, news in taken:
                # Stored before the live jobs are read (the plan sees them), their events at commit.
                await handoff.handle_in(tx, news)
                await tx.write_queued(outbox=False)
            live = await self.live.read(tx.conn)
            now = self.clock.now()
            ledger = self.feed.ledger
            if self.framework is not None:
                await self.refresh_datasets(tx)
            if self.fairshare.updated_at == 0.0:
                # First cycle of this leader: usage from the job history (4 half-lives back).
                since = now - dt.timedelta(seconds=4 * self.cfg.fairshare_half_life_s)
                history = await state.usage_history(tx.conn, since)
                self.fairshare = seeded_usage(history, live, now, self.cfg.fairshare_half_life_s)
            plan = plan_cycle(
                ledger,
                live,
                now,
                self.policy,
                self.cycle_config,
                self.cfg.leaf_label,
                self.plan_cache,
                placement=self.placement_inputs(self.live.tally(), now, live),
                queue_rules=self.queue_rules,
                predictions=estimates_of(self.predictor, live.queued()),
                in_flight=self.live.in_flight(ledger),
            )
            self.backlog = self.live.queued - len(plan.proposals)
            await self._write(tx, plan, self.live.by_id, term, now)
            proposed = (a for p in plan.proposals for a in p.assignments)
            replacing = await members.propose_replacements(self, tx, ledger, proposed, term, now)
            # News is acked after this commit: it must be on disk by then.
            if not durable and (taken or plan.commits_durably(replacing)):
                await state.commit_durably(tx.conn)
            if self.renewals_due():
                await tx.outbox(*self.renewals(live, now))
        self._fenced_term = term
        return plan

    def placement_inputs(self, tally: state.Tally, now: dt.datetime, live: LiveBook | None = None) -> PlacementInputs:
        """Fair share brought to `now` (usage of the jobs holding GPUs, `tally`), and what the plugins
        read; the SHARP trees the `live` jobs hold."""
        if self.fairshare.updated_at == 0.0:
            self.fairshare = FairShareState(updated_at=now.timestamp())
        self.fairshare = accrue(self.fairshare, now.timestamp(), tally.held, self.cfg.fairshare_half_life_s)
        self.fairshare_factors = fairshare_factors(self.fairshare, tally.waiting, self.cfg.fairshare_shares or None)
        if self.framework is None:
            return PlacementInputs(fairshare=self.fairshare_factors)
        fabric = self.fabric_in_force()
        if fabric is not None:
            links, links_version = self.fabric_feed.link_health(), self.fabric_feed.links_version
        else:  # no fabric yet: the links at each node's own adapters
            links = self.nodes.node_links(self.fabric_feed.links)
            links_version = self.fabric_feed.links_version + self.nodes.adapters_version
        return PlacementInputs(
            self.framework,
            fabric=fabric,
            telemetry=self.telemetry(now),
            node_links=links,
            links_version=links_version,
            datasets=self.datasets,
            datasets_version=self.datasets_version,
            sharp_label=self.cfg.sharp_label,
            site_label=self.cfg.site_label,
            site_transfer_s=self.cfg.site_transfer_s,
            sample=self.cfg.placement_sample,
            fairshare=self.fairshare_factors,
            sharp_limits=self.cfg.sharp_limits,
            sharp_held=live.sharp_held() if live is not None else {},
        )

    def fabric_in_force(self) -> FabricState | None:
        """The published fabric placement decides on: None while none is known, and while it names
        none of the pool's nodes (the fabric monitor names its hosts otherwise than the agents name
        their nodes: said once, loudly; the node labels stand in, as with no fabric)."""
        fabric = self.fabric.state
        if fabric is None:
            return None
        nodes = self.feed.ledger.nodes
        if nodes and not any(n in fabric.leaf_of for n in nodes):
            if self._mismatch_logged is not fabric:
                self._mismatch_logged = fabric
                log.warning(
                    "the published fabric names none of the pool's nodes; placing on the node labels",
                    fabric_version=fabric.about.version,
                    fabric_hosts=fabric.about.hosts,
                    first_fabric_host=next(iter(fabric.leaf_of), None),
                    first_node=next(iter(nodes), None),
                )
            return None
        return fabric

    def leaf_source(self) -> LeafSource:
        """Where leaf groups come from now: the published fabric in force, else the `leaf_label` label."""
        return LeafSource(self.cfg.leaf_label, self.fabric_in_force() if self.framework is not None else None)

    def telemetry(self, now: dt.datetime) -> Mapping[str, Telemetry]:
        """node id -> the placement view of its newest telemetry not older than `telemetry_max_age_s`
        (`PlacementTelemetry`: kept by the samples that came and aged out since the last call)."""
        return self._telemetry.update(self.nodes, self.feed.ledger.nodes, now)

    async def refresh_datasets(self, tx: Transaction) -> None:
        """The dataset registry: the config's entries plus the stored ones (PUT /v1/datasets), when
        `datasets_due`."""
        if not self.datasets_due():
            return
        stored = await state.datasets(tx.conn)
        merged: dict[str, list[str]] = {k: list(v) for k, v in self.cfg.datasets.items()}
        for name, nodes in stored.items():
            merged[name] = sorted({*merged.get(name, []), *nodes})
        if merged != self.datasets:
            self.datasets = merged
            self.datasets_version += 1

    def datasets_changed(self) -> None:
        """The registry was changed through this replica: the next cycle reads it."""
        self.datasets_due.now()

    async def _write(
        self, tx: Transaction, plan: CyclePlan, live: Mapping[str, JobRecord], term: int | None, now: dt.datetime
    ) -> None:
        """The cycle's job changes (the core's `job_changes`), each only if the row is still what the
        cycle read, and their events."""
        stamp = ProposalStamp(source=self.kit.source, group=self.group, lease_s=self.cfg.lease_s, term=term)
        changes = job_changes(plan, live, now, self.lifecycle, stamp, self.stamped)
        if not changes:
            return
        ordered = sorted(changes)  # one lock order for every cycle
        written = await tx.conn.fetch(
            CONDITIONAL_UPDATE,
            now,
            ordered,
            [self.live.stored_body(j) for j in ordered],
            [changes[j][1].state for j in ordered],
            [state.body_of(changes[j][1]) for j in ordered],
        )
        kept = {r["job_id"] for r in written}
        out: list[Message] = []
        # Releases and preemptions first: the allocator frees the victims' GPUs before the proposals need them.
        for job_id in [*plan.preempted_ids(), *plan.killed]:
            if job_id in kept:
                out.extend(changes[job_id][2])
        proposals = [
            m
            for p in plan.proposals
            if p.job_id in kept
            for m in changes[p.job_id][2]
            if isinstance(m, ProposePlacement)
        ]
        if self.cfg.batch_proposals and len(proposals) > 1:
            out.append(self.batch(proposals, plan.ledger_version, term))
        else:
            out.extend(proposals)
        await tx.outbox(*out)
        self.proposed.inc(sum(1 for p in plan.proposals if p.job_id in kept))

    def stamped(self, job: JobRecord) -> JobRecord:
        """The record carrying the prediction this cycle used for it (shown by GET /v1/jobs/{id})."""
        return self.predictor.stamped(job) if self.predictor is not None else job

    def batch(self, proposals: list[ProposePlacement], ledger_version: int, term: int | None) -> ProposePlacements:
        """The cycle's proposals as one command; each keeps its id (the job's `proposal_id`)."""
        return ProposePlacements(
            source=self.kit.source,
            key=self.group,
            ledger_version=ledger_version,
            scheduler_group=self.group,
            fencing_term=term,
            placements=[
                PlacementItem(
                    id=p.id,
                    job_id=p.job_id,
                    tenant=p.tenant,
                    queue=p.queue,
                    assignments=p.assignments,
                    lease_s=p.lease_s,
                    workload=p.workload,
                    on_member_failure=p.on_member_failure,
                )
                for p in proposals
            ],
        )

    def renewals(self, live: Sequence[JobRecord], now: dt.datetime) -> list[RenewLease]:
        """Renew the leases the core finds due (`leases_due`; of the cycle's book, `LeaseWatch`, which
        follows the book's changes), each at most once per quarter of `lease_s`."""
        out: list[RenewLease] = []
        clock = time.monotonic()
        allocations = self.feed.ledger.allocations
        if isinstance(live, LiveBook):
            due = self.lease_watch.due(live, allocations, now, self.cfg.lease_s)
        else:
            due = leases_due(live, allocations, now, self.cfg.lease_s)
        for job_id, allocation_id in due:
            if clock - self._renewed.get(allocation_id, -1e18) < self.cfg.lease_s / 4:
                continue  # renewed lately: the renewal is on its way
            self._renewed[allocation_id] = clock
            out.append(
                RenewLease(
                    source=self.kit.source,
                    key=allocation_id,
                    allocation_id=allocation_id,
                    holder=job_id,
                    extend_s=self.cfg.lease_s,
                )
            )
        if len(self._renewed) > 2 * len(allocations) + 1_000:  # forget the allocations that ended
            self._renewed = {a: at for a, at in self._renewed.items() if a in allocations}
        return out

    # -- loops ----------------------------------------------------------------------------------

    async def leader_loop(self, stop: asyncio.Event) -> None:
        if self.leadership is not None:
            await self.leadership.run(stop)

    async def cycle_loop(self, stop: asyncio.Event) -> None:
        """A cycle every `cycle_interval_s`, and one soon after news (a submission, freed capacity)."""
        while not stop.is_set():
            waits = [asyncio.ensure_future(e.wait()) for e in (self.wake, self.feed.changed, stop)]
            try:
                await asyncio.wait(waits, timeout=self.cfg.cycle_interval_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            if stop.is_set():
                break
            only_the_ledger_moved = self.feed.changed.is_set() and not self.wake.is_set()
            self.wake.clear()
            self.feed.changed.clear()
            if only_the_ledger_moved and self.backlog <= 0:
                continue  # freed capacity with nobody waiting: the next timer cycle renews leases
            await asyncio.sleep(self.cfg.cycle_debounce_s)
            try:
                await self.cycle_once()
            except OUTAGES as e:  # a store hiccup (or a deadlock victim) must not end scheduling
                self.kit.metrics.loop_failed("scheduling cycle", e)
                log.warning("scheduling cycle failed", error=str(e) or type(e).__name__)
