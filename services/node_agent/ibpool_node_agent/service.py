"""The node agent: subscriptions -> ibpool_core.workload -> outbox, plus its heartbeat and telemetry loops.

Registrations and job start/exit leave through the outbox (never lost); heartbeats and telemetry
are published directly (a lost sample is replaced by the next one).
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from ibpool_core import workload as core
from ibpool_core.clock import Clock
from ibpool_proto.node import NodeDeregistered, NodeHeartbeat, NodeRegistered, TelemetryReported
from ibpool_proto.pool import AllocationExpired, AllocationGranted, AllocationReleased, AllocationRevoked, Enforcement
from ibpool_runtime.consumer import HandlerContext, Subscription
from ibpool_runtime.logs import get_logger
from ibpool_runtime.service import Kit, sleep_unless_stopped

from . import state
from .backends import GpuBackend
from .config import NodeAgentConfig
from .enforcers import EnforcementError

log = get_logger(__name__)

WORKLOAD_TICK_S = 0.2


class NodeAgent:
    def __init__(self, kit: Kit[NodeAgentConfig], backends: list[GpuBackend], clock: Clock) -> None:
        self.kit = kit
        self.cfg = kit.config
        self.backends = {b.node_id: b for b in backends}
        self.gpu_counts = {b.node_id: len(b.inventory()) for b in backends}
        self.clock = clock
        self.heartbeats_sent = 0
        # node id -> allocation ids running there, refreshed from the store by the workload loop
        self.running: dict[str, list[str]] = {n: [] for n in self.backends}
        self._load: dict[str, dict[int, int]] = {n: {} for n in self.backends}

    @property
    def node_ids(self) -> list[str]:
        return sorted(self.backends)

    def subscriptions(self) -> list[Subscription]:
        filters: list[str] = []
        for n in self.node_ids:
            filters += [
                AllocationGranted.subject(n),
                AllocationRevoked.subject(n),
                AllocationReleased.subject(n),
                AllocationExpired.subject(n),
            ]
        durable = f"node-agent-{self.cfg.node_prefix}-{self.cfg.first_node}-{self.cfg.nodes}"
        return [Subscription(durable=durable, filter_subjects=tuple(filters), handler=self.on_allocation_event)]

    async def on_allocation_event(self, event: object, ctx: HandlerContext) -> None:
        assert ctx.tx is not None
        now = self.clock.now()
        match event:
            case AllocationGranted():
                running = {w.allocation_id for w in await state.running(ctx.tx.conn, [event.node_id])}
                decision = core.admit_grant(
                    event,
                    hosted_nodes=self.gpu_counts,
                    running=running,
                    now=now,
                    source=self.kit.source,
                    default_runtime_s=self.cfg.default_runtime_s,
                )
                match decision:
                    case core.GrantAdmitted(workload=w, started=started):
                        try:
                            applied = self.backends[event.node_id].enforcer.apply(w.allocation_id, event.enforcement)
                        except EnforcementError as e:
                            log.warning("grant not enforceable", allocation_id=w.allocation_id, reason=str(e))
                            detail = f"enforcement: {e}"
                            await ctx.emit(core.refuse_grant(event, now=now, source=self.kit.source, detail=detail))
                            return
                        w = msgspec.structs.replace(w, env=applied.env, mig_instances=applied.mig_instances)
                        await state.insert_workload(ctx.tx.conn, w)
                        await ctx.emit(started)
                    case core.GrantRefused(exited=exited):
                        await ctx.emit(exited)
                    case core.GrantIgnored(reason=reason):
                        log.info("grant ignored", allocation_id=event.allocation_id, reason=reason)
            case AllocationRevoked() | AllocationReleased() | AllocationExpired():
                w = await state.running_one(ctx.tx.conn, event.allocation_id)
                if w is None:
                    log.info("ended allocation is not running here", allocation_id=event.allocation_id)
                    return
                exited = core.stop_revoked(w, event, now=now, source=self.kit.source)
                await state.mark_exited(ctx.tx.conn, exited)
                await ctx.emit(exited)
                self.backends[w.node_id].enforcer.release(w.allocation_id)
            case _:
                log.warning("unexpected event for the node agent", type=type(event).__name__)

    async def register(self) -> None:
        """Announce every hosted node (on start; the outbox makes it survive a crash)."""
        now = self.clock.now()
        async with self.kit.store.transaction() as tx:
            for b in self.backends.values():
                gpus = b.inventory()
                await state.upsert_node(tx.conn, b.node_id, b.hostname, b.name, gpus, now)
                await tx.outbox(
                    NodeRegistered(
                        source=self.kit.source,
                        key=b.node_id,
                        occurred_at=now,
                        node_id=b.node_id,
                        hostname=b.hostname,
                        cpu_milli=self.cfg.cpu_milli,
                        memory_mib=self.cfg.memory_mib,
                        gpus=gpus,
                        backend=b.name,
                        labels={"ibpool.io/gpu-model": gpus[0].model if gpus else ""},
                    )
                )
            self.reapply(await state.running(tx.conn, self.node_ids))

    def reapply(self, work: list[core.Workload]) -> None:
        """Put the limits of work that ran before a restart back in force (the enforcers start empty)."""
        for w in work:
            again = Enforcement(env=w.env, mig_instances=w.mig_instances, memory_limit_mib=w.memory_limit_mib)
            try:
                self.backends[w.node_id].enforcer.apply(w.allocation_id, again)
            except EnforcementError as e:
                log.warning("limits of running work not re-applied", allocation_id=w.allocation_id, reason=str(e))

    async def deregister(self) -> None:
        now = self.clock.now()
        async with self.kit.store.transaction() as tx:
            await tx.outbox(
                *[
                    NodeDeregistered(source=self.kit.source, key=n, occurred_at=now, node_id=n, reason="agent stopped")
                    for n in self.node_ids
                ]
            )

    async def heartbeat_loop(self, stop: asyncio.Event) -> None:
        seq = 0
        interval = self.cfg.heartbeat_interval_s
        while not stop.is_set():
            seq += 1
            now = self.clock.now()
            for n in self.node_ids:
                await self.kit.bus.publish_unacked(
                    NodeHeartbeat(
                        source=self.kit.source,
                        key=n,
                        occurred_at=now,
                        node_id=n,
                        seq=seq,
                        interval_s=interval,
                        running_allocations=self.running.get(n, []),
                    )
                )
            self.heartbeats_sent += len(self.node_ids)
            await sleep_unless_stopped(stop, interval)

    async def telemetry_loop(self, stop: asyncio.Event) -> None:
        last = time.monotonic()
        while not stop.is_set():
            now_mono = time.monotonic()
            dt_s, last = now_mono - last, now_mono
            now = self.clock.now()
            for n, b in self.backends.items():
                load = self._load.get(n, {})
                try:
                    gpus, host = b.sample(dt_s, load), b.host(load)
                except Exception as e:  # one bad read must not stop telemetry of the other nodes
                    log.warning("telemetry read failed", node_id=n, error=str(e))
                    continue
                sample = TelemetryReported(
                    source=self.kit.source, key=n, occurred_at=now, node_id=n, gpus=gpus, host=host
                )
                await self.kit.bus.publish_unacked(sample)
            await sleep_unless_stopped(stop, self.cfg.telemetry_interval_s)

    async def workload_loop(self, stop: asyncio.Event) -> None:
        """Finish simulated work whose time has come and keep the in-memory view current."""
        while not stop.is_set():
            try:
                await self.finish_due_work()
            except Exception as e:
                log.warning("workload tick failed", error=str(e) or type(e).__name__)
            await sleep_unless_stopped(stop, WORKLOAD_TICK_S)

    async def finish_due_work(self) -> int:
        now = self.clock.now()
        async with self.kit.store.transaction() as tx:
            work = await state.running(tx.conn, self.node_ids)
            due = core.finish_due(work, now=now, source=self.kit.source)
            for _, exited in due:
                if await state.mark_exited(tx.conn, exited):
                    await tx.outbox(exited)
        finished = {w.allocation_id for w, _ in due}
        for w, _ in due:
            self.backends[w.node_id].enforcer.release(w.allocation_id)
        still = [w for w in work if w.allocation_id not in finished]
        self.running = {n: [w.allocation_id for w in still if w.node_id == n] for n in self.node_ids}
        load: dict[str, dict[int, int]] = {n: {} for n in self.node_ids}
        for w in still:
            per_gpu = (w.memory_demand_mib or 20_000) // max(1, len(w.gpu_indices))
            for i in w.gpu_indices:
                load[w.node_id][i] = load[w.node_id].get(i, 0) + per_gpu
        self._load = load
        return len(due)
