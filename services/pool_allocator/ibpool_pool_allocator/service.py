"""The pool allocator: commands and node/health news -> ibpool_core.pool.allocate.decide -> ledger events out.

The ledger lives in Postgres as its event log (`ledger_events`) behind its newest snapshot
(`ledger_snapshots`); this process keeps it in memory as a cache. Every change runs in a
transaction that takes the ledger lock, brings the cache up to the log (another replica wrote, or
a rolled-back transaction left the cache ahead: rebuilt), decides, appends the events to the log
and the outbox, and applies them to the cache. A consumer batch is one transaction: its commands
lock and catch up once and their rows are written together at commit (see `PoolAllocator.commit`).

Every `snapshot_interval_s` the ledger, when it changed, is snapshotted: kept in the store, where
the log before it is then deleted, and published to the bus for the ledger replicas of other
services, which cannot replay the pool stream from the ledger's first event once the stream has
dropped it (ibpool_runtime.ledger_replica).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ibpool_core.clock import Clock
from ibpool_core.fabric.view import FabricView
from ibpool_core.pool.allocate import AllocatorConfig, Decision, Hops, Input, decide, expire
from ibpool_core.pool.ledger import (
    Ledger,
    LedgerSnapshot,
    apply,
    check_format,
    decode_ledger,
    encode_ledger,
    without_past,
)
from ibpool_core.pool.placement import GpuPlacer
from ibpool_core.pool.policy_placer import policy_placer
from ibpool_proto.health import Cordoned, DrainRequested, GpuFailed, GpuRecovered, NodeFailed, NodeRecovered, Uncordoned
from ibpool_proto.node import NodeDeregistered, NodeRegistered
from ibpool_proto.pool import (
    AllocationGranted,
    ProposePlacement,
    ProposePlacements,
    ReleaseAllocation,
    RenewLease,
    ReplaceGangMember,
    RequestAllocation,
    SetQuota,
)
from ibpool_runtime.consumer import HandlerContext, Subscription
from ibpool_runtime.fabric_feed import FabricFeed
from ibpool_runtime.ledger_replica import publish_snapshot
from ibpool_runtime.logs import get_logger
from ibpool_runtime.service import Kit, StartRefused, repeat_until_stopped
from ibpool_runtime.store import Transaction
from ibpool_runtime.streams import stream_for_subject

from . import state
from .config import PoolAllocatorConfig
from .fragmentation_measure import FragmentationReader
from .gpu_states import gpu_states, schedulable

log = get_logger(__name__)

COMMANDS = (
    ProposePlacement,
    ProposePlacements,
    ReplaceGangMember,
    RequestAllocation,
    ReleaseAllocation,
    RenewLease,
    SetQuota,
)
NODE_NEWS = (NodeRegistered, NodeDeregistered)
HEALTH_NEWS = (NodeFailed, NodeRecovered, GpuFailed, GpuRecovered, Cordoned, Uncordoned, DrainRequested)

Choice = Callable[[Ledger, dt.datetime], Decision]
# A catch-up that found the log deleted up to a newer snapshot starts again from it; this many times at most.
CATCH_UP_TRIES = 5
# Rows of the log read per statement when catching up.
LOG_PAGE = 10_000


class PoolAllocator:
    def __init__(
        self,
        kit: Kit[PoolAllocatorConfig],
        clock: Clock,
        place: GpuPlacer | None = None,
        hops: Hops | None = None,
        fabric: FabricView | None = None,
    ) -> None:
        self.kit = kit
        self.cfg = kit.config
        self.clock = clock
        # The fabric as last published (or read from `fabric_file`): leaf groups and hops.
        self.fabric = fabric if fabric is not None else FabricView()
        # Links are not followed here: the allocator takes leaf cordons from the failover controller.
        self.fabric_feed = FabricFeed(
            kit,
            self.fabric,
            fetch_timeout_s=self.cfg.fabric_fetch_timeout_s,
            durable_prefix=self.cfg.durable_prefix,
            follow_links=False,
        )
        # Default: the config's packing policy (bootstrap validates the name and passes it in).
        self.place = place if place is not None else policy_placer(self.cfg.placement_policy, self.fabric)
        self.hops = hops if hops is not None else self.fabric.hops
        self.fragmentation = FragmentationReader(self.place)
        self.core = AllocatorConfig(
            source=kit.source, max_remote_hops=self.cfg.max_remote_hops, fine_grained=self.cfg.fine_grained
        )
        self.ledger = Ledger()
        # Where the cache stands in ledger_events, and the id of the event there.
        self.position: state.Position = state.START
        self.position_id: str | None = None
        self._locked: Transaction | None = None  # the transaction holding the ledger lock, cache caught up
        self.rebuilds = 0
        # The positions of the newest snapshot this process loaded or stored, and of the one it published.
        self.snapshot_at: state.Position = state.START
        self.published_at: state.Position = state.START
        registry = kit.metrics.registry
        self.grants = Counter("ibpool_pool_grants", "Allocations granted", ["kind"], registry=registry)
        self.rejections = Counter("ibpool_pool_rejections", "Allocations rejected", ["reason"], registry=registry)
        self.commit_seconds = Histogram(
            "ibpool_pool_commit_seconds",
            "Lock, catch up, decide and append one ledger change",
            registry=registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
        )
        self.snapshot_version = Gauge(
            "ibpool_pool_snapshot_version",
            "Ledger version of the newest snapshot this replica took (0: none yet)",
            registry=registry,
        )
        self.snapshot_time = Gauge(
            "ibpool_pool_snapshot_timestamp_seconds",
            "When this replica last took a ledger snapshot (Unix time; 0: none yet)",
            registry=registry,
        )
        registry.register(_PoolCollector(self))

    def subscriptions(self) -> list[Subscription]:
        p = self.cfg.durable_prefix
        return [
            Subscription(f"{p}-commands", tuple(c.subject_pattern() for c in COMMANDS), self.on_input),
            Subscription(f"{p}-nodes", tuple(c.subject_pattern() for c in NODE_NEWS), self.on_input),
            Subscription(f"{p}-health", tuple(c.subject_pattern() for c in HEALTH_NEWS), self.on_input),
            self.fabric_feed.subscription(),
        ]

    async def on_input(self, message: Input | ProposePlacements, ctx: HandlerContext) -> None:
        assert ctx.tx is not None
        if isinstance(message, ProposePlacements):
            # A batch: each placement decided and answered as a ProposePlacement of its own, in
            # order, in this one transaction (the ledger lock and catch-up are taken once). Fencing
            # is the batch's: a stale term rejects every placement of it as `stale`.
            for proposal in message.proposals():
                await self.commit(ctx.tx, self.decider(proposal))
            return
        decision = await self.commit(ctx.tx, self.decider(message))
        if decision.note:
            log.info("nothing to do", type=type(message).__name__, id=message.id, note=decision.note)

    def decider(self, message: Input) -> Choice:
        def choose(ledger: Ledger, now: dt.datetime) -> Decision:
            return decide(ledger, message, now, place=self.place, hops=self.hops, config=self.core)

        return choose

    async def submit(self, message: Input) -> Decision:
        """Decide on a command outside a consumer (the HTTP API), committed in its own transaction."""
        async with self.kit.store.transaction() as tx:
            return await self.commit(tx, self.decider(message))

    async def commit(self, tx: Transaction, choose: Choice) -> Decision:
        """Decide on the cache caught up to the log, under the ledger lock; log, outbox and cache take the events.

        The first change of a transaction takes the lock and catches up (two round trips). Later
        changes of the same transaction decide at once: the lock, held to its end, keeps the cache
        equal to the log plus the changes of this transaction, whose log and outbox rows are queued
        and written with one statement each at commit. If the transaction rolls back, the cache
        is ahead of the log, and the next transaction's catch-up rebuilds it. Inside a savepoint,
        which may roll back while the transaction goes on, every change locks, catches up and
        writes its log rows at once, as a change alone would.
        """
        started = time.perf_counter()
        if tx is not self._locked or tx.in_savepoint:
            await state.lock_ledger(tx.conn, self.kit.store.schema)
            await self.catch_up(tx)
            self._locked = None if tx.in_savepoint else tx
        decision = choose(self.ledger, self.clock.now())
        if decision.conflict:  # an id reused for another request: the first answer stands, nothing is sent
            log.warning("command id reused for another request", why=decision.conflict)
        if decision.events and not decision.repeat:
            try:
                await tx.outbox(*decision.events)
                if tx.in_savepoint:
                    position = await state.append(tx.conn, self.position, decision.events)
                else:
                    rows, position = state.log_rows(self.position, decision.events)
                    tx.executemany_at_commit(state.APPEND, rows)
                apply(self.ledger, decision.events)
            except BaseException:
                # The cache may hold part of this change: rebuild it from the log on the next change.
                self.ledger, self.position, self.position_id, self._locked = Ledger(), state.START, None, None
                raise
            self.position, self.position_id = position, decision.events[-1].id
            for g in decision.granted:
                self.grants.labels(g.kind).inc()
            if (r := decision.rejection) is not None:
                self.rejections.labels(r.reason).inc()
        self.commit_seconds.observe(time.perf_counter() - started)
        return decision

    async def catch_up(self, tx: Transaction) -> None:
        """Make the cache the log as committed: apply what others appended, `LOG_PAGE` rows per read,
        or start over from the newest snapshot when the log no longer holds the cache's last event:
        a rolled-back transaction left the cache ahead, or a snapshot (another replica's) deleted the
        log up to it."""
        misses = 0
        while True:
            if self.position == state.START and (snapshot := await state.latest_snapshot(tx.conn)) is not None:
                # The log before it is gone: a snapshot this version cannot read stops the allocator.
                check_format(snapshot.format, f"the stored ledger snapshot at {snapshot.at}")
                self.ledger, self.position = decode_ledger(snapshot.ledger), snapshot.at
                self.position_id, self.snapshot_at = snapshot.event_id, snapshot.at
            rows = await state.log_from(tx.conn, self.position, LOG_PAGE)
            if self.position == state.START:
                # No snapshot: the log must begin at its first row, unless a first snapshot cut it meanwhile.
                consistent, fresh = not rows or state.is_first_row(rows[0].at), rows
            else:
                consistent, fresh = bool(rows) and rows[0].event_id == self.position_id, rows[1:]
            if not consistent:
                misses += 1
                if misses > CATCH_UP_TRIES:
                    # Each read met a newer snapshot: only a log whose rows were deleted by hand gets here.
                    raise RuntimeError(
                        f"ledger_events does not hold the row of the newest ledger snapshot after {misses} reads"
                    )
                if self.position != state.START:
                    self.ledger, self.position, self.position_id = Ledger(), state.START, None
                    self.rebuilds += 1
                    log.info("ledger cache rebuilt from the log")
                continue
            if fresh:
                apply(self.ledger, [r.event() for r in fresh])
                self.position, self.position_id = fresh[-1].at, fresh[-1].event_id
            if len(rows) < LOG_PAGE:
                return

    async def expire_once(self) -> Decision:
        # Always under the lock on the caught-up ledger: another replica may hold the leases that ran out.
        async with self.kit.store.transaction() as tx:
            return await self.commit(tx, lambda ledger, at: expire(ledger, at, config=self.core))

    async def expiry_loop(self, stop: asyncio.Event) -> None:
        await repeat_until_stopped(
            stop, self.cfg.expiry_interval_s, self.expire_once, "lease expiry", metrics=self.kit.metrics
        )

    async def snapshot_once(self, stop: asyncio.Event | None = None) -> state.Position | None:
        """Snapshot the ledger if it changed since the last snapshot: keep it in the store, delete
        the log before it (stopping between chunks once `stop` is set), publish it for the ledger
        replicas; publish it at least once per process, so a snapshot stored but never published
        (a crash between the two, a lost bucket) reaches the replicas. One replica at a time.
        Returns the position snapshotted; None when there was nothing to do."""
        async with self.kit.store.transaction() as turn:
            if not await state.take_snapshot_turn(turn.conn, self.kit.store.schema):
                return None  # another replica is taking one
            # Read before the ledger is taken: every event of a later version is published after it.
            pool_stream = stream_for_subject(AllocationGranted.subject_pattern())
            stream_seq = (await self.kit.bus.js.stream_info(pool_stream)).state.last_seq + 1
            async with self.kit.store.transaction() as tx:
                await state.lock_ledger(tx.conn, self.kit.store.schema)
                await self.catch_up(tx)
                at, event_id = self.position, self.position_id
                if at == state.START or event_id is None or at == self.published_at:
                    return None
                stored = None if at == self.snapshot_at else state.Snapshot(at, event_id, encode_ledger(self.ledger))
                for_replicas = LedgerSnapshot(
                    version=self.ledger.version, stream_seq=stream_seq, ledger=encode_ledger(without_past(self.ledger))
                )
            deleted = 0
            if stored is not None:
                # Written after the ledger lock is given back (a large ledger is MBs): its row is committed.
                async with self.kit.store.transaction() as tx:
                    await state.save_snapshot(tx.conn, stored)
                self.snapshot_at = at
                deleted = await self.kit.store.delete_in_chunks(state.PRUNE_LOG, *at, stop=stop)
            published = await publish_snapshot(self.kit.bus, for_replicas, self.cfg.stream_replicas)
            self.published_at = at
        self.snapshot_version.set(for_replicas.version)
        self.snapshot_time.set_to_current_time()
        log.info(
            "ledger snapshot taken" if stored is not None else "ledger snapshot published again",
            version=for_replicas.version,
            stored_bytes=len(stored.ledger) if stored is not None else 0,
            published_bytes=published,
            stream_seq=stream_seq,
            log_rows_deleted=deleted,
        )
        return at

    async def snapshot_loop(self, stop: asyncio.Event) -> None:
        await repeat_until_stopped(
            stop,
            self.cfg.snapshot_interval_s,
            lambda: self.snapshot_once(stop),
            "ledger snapshot",
            metrics=self.kit.metrics,
        )

    async def check_snapshot(self) -> None:
        """StartRefused when the stored snapshot is of a ledger format this version cannot read: the
        log before it is gone, so the ledger cannot be had without it."""
        snapshot = await state.latest_snapshot(self.kit.store.pool)
        if snapshot is not None:
            try:
                check_format(snapshot.format, f"the stored ledger snapshot at {snapshot.at}")
            except ValueError as e:
                raise StartRefused(f"{e}: run a version that reads it") from None

    async def load(self) -> None:
        """Fill the cache from the log on start."""
        async with self.kit.store.transaction() as tx:
            await state.lock_ledger(tx.conn, self.kit.store.schema)
            await self.catch_up(tx)
        log.info("ledger loaded", version=self.ledger.version, nodes=len(self.ledger.nodes))


class _PoolCollector(Collector):
    """Capacity and allocated GPU-milli per model, GPUs per model and state, read from the cache at
    scrape time. Every replica reports the whole pool: its cache is brought up to the ledger's log
    by each change it makes, lease expiry included (every `expiry_interval_s`)."""

    def __init__(self, allocator: PoolAllocator) -> None:
        self.allocator = allocator

    def collect(self):  # type: ignore[no-untyped-def]
        capacity = GaugeMetricFamily("ibpool_pool_capacity_milli", "GPU-milli in the pool", labels=["model"])
        allocated = GaugeMetricFamily("ibpool_pool_allocated_milli", "GPU-milli granted", labels=["model"])
        partial = GaugeMetricFamily(
            "ibpool_pool_partial_free_milli",
            "Free GPU-milli on partly granted GPUs: unusable by whole-GPU requests (a simple fragmentation measure)",
            labels=["model"],
        )
        totals: dict[str, list[int]] = {}
        for node in self.allocator.ledger.nodes.values():
            for g in node.gpus:
                t = totals.setdefault(g.model, [0, 0, 0])
                t[0] += 1000
                t[1] += g.granted_milli
                t[2] += g.free_milli if 0 < g.granted_milli < 1000 else 0
        for model, (cap, used, part) in sorted(totals.items()):
            capacity.add_metric([model], cap)
            allocated.add_metric([model], used)
            partial.add_metric([model], part)
        measured = self.allocator.fragmentation.read(self.allocator.ledger)
        fragmented = GaugeMetricFamily(
            "ibpool_pool_fragmentation_milli",
            "Fragmented free GPU-milli: FGD's expected fragment for the learned workload mix (measure fgd), "
            "or the free milli of partly granted GPUs before any request (measure partial_free)",
            labels=["model", "measure"],
        )
        for model, milli in sorted(measured.milli.items()):
            fragmented.add_metric([model, measured.measure], milli)
        gpus = GaugeMetricFamily(
            "ibpool_pool_gpus",
            "GPUs per model and state (free, allocated, cordoned, draining, failed); fractions and MIG slices"
            " count as their share. Every replica reports the whole pool: aggregate replicas with max, not sum",
            labels=["model", "state"],
        )
        schedulable_gpus = GaugeMetricFamily(
            "ibpool_pool_capacity_gpus",
            "Schedulable GPUs per model (allocated + free: without failed, draining and cordoned GPUs)."
            " Every replica reports the whole pool: aggregate replicas with max, not sum",
            labels=["model"],
        )
        for model, states in gpu_states(self.allocator.ledger).items():
            for gpu_state, n in states.items():
                gpus.add_metric([model, gpu_state], n)
            schedulable_gpus.add_metric([model], schedulable(states))
        version = GaugeMetricFamily(
            "ibpool_pool_ledger_version", "Ledger version of this replica's cache (the pool gauges are as of it)"
        )
        version.add_metric([], self.allocator.ledger.version)
        yield capacity
        yield allocated
        yield partial
        yield fragmented
        yield gpus
        yield schedulable_gpus
        yield version
