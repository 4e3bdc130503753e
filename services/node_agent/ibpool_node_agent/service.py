"""The node agent: subscriptions -> ibpool_core.workload -> outbox, plus its heartbeat and telemetry loops.

Registrations and job start/exit leave through the outbox (never lost); heartbeats and telemetry
are published directly (a lost sample is replaced by the next one).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import tempfile
import time
from pathlib import Path

import msgspec
from prometheus_client import CollectorRegistry, Counter

from ibpool_core import workload as core
from ibpool_core.clock import Clock
from ibpool_proto.node import (
    GpuSample,
    HcaPortsReported,
    HostSample,
    NodeDeregistered,
    NodeHeartbeat,
    NodeRegistered,
    TelemetryReported,
)
from ibpool_proto.pool import AllocationExpired, AllocationGranted, AllocationReleased, AllocationRevoked, Enforcement
from ibpool_runtime.bus_permissions import agent_durable
from ibpool_runtime.config import ConfigError
from ibpool_runtime.consumer import HandlerContext, Refused, Subscription
from ibpool_runtime.grant_signing import GrantVerifier, SigningKeyError
from ibpool_runtime.hca_sysfs import read_hca_ports
from ibpool_runtime.logs import get_logger
from ibpool_runtime.service import Kit, repeat_until_stopped, sleep_unless_stopped
from ibpool_runtime.telemetry_buffer import TelemetryBuffer

from . import state
from .backends import GpuBackend, ReadFailure, SimulatedBackend, node_prefix
from .config import NodeAgentConfig
from .dcgm import DcgmCollector, DcgmHost
from .enforcers import EnforcementError
from .environment import RankError, workload_env
from .hosts import HostMetrics
from .launcher import LaunchError, ProcessLauncher

log = get_logger(__name__)

WORKLOAD_TICK_S = 0.2
# How long one wait on an NVML event set lasts (the XID watcher's thread checks for stop between waits).
XID_WAIT_S = 0.5
# How often exited workloads past `workload_retention_s` are deleted.
PRUNE_EVERY_S = 600.0


class NodeAgent:
    def __init__(self, kit: Kit[NodeAgentConfig], backends: list[GpuBackend], clock: Clock) -> None:
        self.kit = kit
        self.cfg = kit.config
        self.backends = {b.node_id: b for b in backends}
        inventories = {b.node_id: b.inventory() for b in backends}
        self.gpu_counts = {n: len(gpus) for n, gpus in inventories.items()}
        self.clock = clock
        # The pool allocator's keys: what this agent acts on must be signed by one (None: not checked).
        self.verifier: GrantVerifier | None = None
        if self.cfg.grant_signers:
            try:
                self.verifier = GrantVerifier(self.cfg.grant_signers)
            except SigningKeyError as e:
                raise ConfigError(f"invalid node_agent config: field `grant_signers`: {e}") from None
        else:
            log.warning("grants are not checked (no grant_signers): a forged grant on the bus would run")
        self.heartbeats_sent = 0
        # node id -> allocation ids running there, refreshed from the store by the workload loop
        self.running: dict[str, list[str]] = {n: [] for n in self.backends}
        self._load: dict[str, dict[int, int]] = {n: {} for n in self.backends}
        self.reports_hca_ports = self.cfg.hca_ports == "sysfs" or (
            self.cfg.hca_ports == "auto"
            and any(b.name == "nvml" for b in backends)
            and Path(self.cfg.sysfs_root, "sys/class/infiniband").is_dir()
        )
        self._hca_problems: set[str] = set()
        # Samples wait here through a bus outage (bounded, oldest dropped first); exits use the outbox.
        self.telemetry = TelemetryBuffer(
            kit.bus.publish, lambda: kit.bus.connected, capacity=self.cfg.telemetry_buffer, metrics=kit.metrics
        )
        self.heartbeats_skipped = 0
        work_dir = Path(self.cfg.work_dir or Path(tempfile.gettempdir()) / "ibpool-node-agent" / kit.source)
        self.launcher = ProcessLauncher(work_dir.expanduser(), stop_grace_s=self.cfg.stop_grace_s)
        # node id -> GPU index -> (when, XID code) seen in telemetry: a process that dies after an XID
        # on its GPUs exits with reason "xid".
        self.xids: dict[str, dict[int, list[tuple[dt.datetime, int]]]] = {n: {} for n in self.backends}
        # Set by an XID (injected, or seen by the XID watcher): sample and publish now, not at the next interval.
        self.sample_now = asyncio.Event()
        self.hosts = HostMetrics({b.node_id for b in backends if b.name == "simulated"})
        self.read_failures = Counter(
            "ibpool_node_agent_read_failures",
            "Telemetry figures that could not be read (left at their default), by node and kind",
            ["node_id", "kind"],
            registry=kit.metrics.registry,
        )
        self._failing_reads: set[tuple[str, str]] = set()  # (node, kind) failing at the last sample
        # node id -> the GPUs of its newest sample (the one last published): read by the dcgm collector.
        self.latest_gpus: dict[str, list[GpuSample]] = {}
        # GET /metrics/dcgm: the newest samples under dcgm-exporter's names and labels (dcgm.py), in a
        # registry of their own, so the service's /metrics stays as it is.
        self.dcgm_registry = CollectorRegistry()
        hosts = [
            DcgmHost(
                node_id=b.node_id,
                hostname=b.hostname,
                gpus=inventories[b.node_id],
                pci_bus_ids=b.pci_bus_ids,
                driver_version=b.driver_version,
            )
            for b in backends
        ]
        self.dcgm_registry.register(DcgmCollector(hosts, self.latest_gpus, self.xids))

    @property
    def node_ids(self) -> list[str]:
        return sorted(self.backends)

    def subscriptions(self) -> list[Subscription]:
        kinds = (AllocationGranted, AllocationRevoked, AllocationReleased, AllocationExpired)
        if len(self.node_ids) > self.cfg.max_node_filters:
            # A simulated agent hosting thousands of nodes: one filter per kind and node would make
            # a consumer nats-server takes seconds to create; it reads every node's and skips others'.
            filters = [k.subject_pattern() for k in kinds]
        else:
            filters = [k.subject(n) for n in self.node_ids for k in kinds]
        durable = agent_durable(node_prefix(self.cfg), self.cfg.first_node, self.cfg.nodes)
        return [Subscription(durable=durable, filter_subjects=tuple(filters), handler=self.on_allocation_event)]

    async def on_allocation_event(self, event: object, ctx: HandlerContext) -> None:
        assert ctx.tx is not None
        if getattr(event, "node_id", None) not in self.backends:
            return  # another agent's node (an agent hosting many reads them all, see `subscriptions`)
        now = self.clock.now()
        if self.verifier is not None:
            why = self.verifier.check(ctx.data, ctx.headers)
            if why is not None:  # counted where it is dead-lettered (ibpool_events_dead_lettered_total, "refused")
                raise Refused(f"{type(event).__name__}: {why}")
        match event:
            case AllocationGranted():
                running = await state.running(ctx.tx.conn, [event.node_id])
                forged = core.forged_grant(event, running, now) if self.verifier is not None else None
                if forged is not None:
                    raise Refused(f"AllocationGranted {event.allocation_id}: {forged}")
                decision = core.admit_grant(
                    event,
                    hosted_nodes=self.gpu_counts,
                    running={w.allocation_id for w in running},
                    now=now,
                    source=self.kit.source,
                    default_runtime_s=self.cfg.default_runtime_s,
                    allow_commands=self.cfg.allow_commands,
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
                        try:
                            env = workload_env(event, applied.env)
                        except RankError as e:
                            self.backends[event.node_id].enforcer.release(w.allocation_id)
                            detail = f"rank: {e}"
                            await ctx.emit(core.refuse_grant(event, now=now, source=self.kit.source, detail=detail))
                            return
                        # The workload's whole environment: the simulated launcher records it, a process runs with it.
                        w = msgspec.structs.replace(w, env=env, mig_instances=applied.mig_instances)
                        if w.launcher == "process":
                            try:
                                env = w.env | {"IBPOOL_ALLOCATION_ID": w.allocation_id, "IBPOOL_NODE_ID": w.node_id}
                                pid = await self.launcher.start(work_key(w.allocation_id, w.node_id), w.command, env)
                            except LaunchError as e:
                                self.backends[event.node_id].enforcer.release(w.allocation_id)
                                await ctx.emit(core.refuse_grant(event, now=now, source=self.kit.source, detail=str(e)))
                                return
                            w = msgspec.structs.replace(w, pid=pid)
                            started = msgspec.structs.replace(started, pid=pid)
                        await state.insert_workload(ctx.tx.conn, w)
                        await ctx.emit(started)
                    case core.GrantRefused(exited=exited):
                        await ctx.emit(exited)
                    case core.GrantIgnored(reason=reason):
                        log.info("grant ignored", allocation_id=event.allocation_id, reason=reason)
            case AllocationRevoked() | AllocationReleased() | AllocationExpired():
                ended = await state.running_one(ctx.tx.conn, event.allocation_id, event.node_id)
                if ended is None:
                    log.info("ended allocation is not running here", allocation_id=event.allocation_id)
                    return
                exited = core.stop_revoked(ended, event, now=now, source=self.kit.source)
                await state.mark_exited(ctx.tx.conn, exited)
                await ctx.emit(exited)
                self.launcher.stop(work_key(ended.allocation_id, ended.node_id))
                self.backends[ended.node_id].enforcer.release(ended.allocation_id)
            case _:
                log.warning("unexpected event for the node agent", type=type(event).__name__)

    async def register(self) -> None:
        """On start: announce every hosted node, put running work's limits back, re-announce after reconnects."""
        await self.announce(reapply=True)
        self.kit.bus.on_reconnect(self.announce)

    async def announce(self, reapply: bool = False) -> None:
        """Announce every hosted node and its inventory (the outbox makes it survive a crash)."""
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
                        labels={**self.cfg.labels, "ibpool.io/gpu-model": gpus[0].model if gpus else ""},
                    )
                )
            if reapply:
                self.reapply(await state.running(tx.conn, self.node_ids))

    def reapply(self, work: list[core.Workload]) -> None:
        """Put the limits of work that ran before a restart back in force (the enforcers start empty)."""
        for w in work:
            if w.launcher == "process" and w.pid is not None:
                self.launcher.adopt(
                    work_key(w.allocation_id, w.node_id), w.pid
                )  # gone already: reported by the workload loop
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
        """A beat for every node each `heartbeat_interval_s`, on a fixed schedule: the time a round
        takes to publish (many nodes on one agent) does not stretch the interval between beats."""
        seq = 0
        interval = self.cfg.heartbeat_interval_s
        started = time.monotonic()
        while not stop.is_set():
            seq += 1
            now = self.clock.now()
            if not self.kit.bus.connected:  # a late heartbeat says nothing about now: skip, do not queue
                self.heartbeats_skipped += len(self.node_ids)
                await sleep_unless_stopped(stop, interval)
                continue
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
            await sleep_unless_stopped(stop, max(0.0, started + seq * interval - time.monotonic()))

    async def telemetry_loop(self, stop: asyncio.Event) -> None:
        last = time.monotonic()
        while not stop.is_set():
            now_mono = time.monotonic()
            dt_s, last = now_mono - last, now_mono
            now = self.clock.now()
            for n, b in self.backends.items():
                load = self._load.get(n, {})
                reading = b.sample(dt_s, load)
                failures = list(reading.failures)
                try:
                    host: HostSample | None = self.hosts.sample(n, load)
                except OSError as e:  # /proc or the root disk unreadable: the GPUs are still reported
                    host = None
                    failures.append(ReadFailure(kind="host", error=str(e)))
                self.note_read_failures(n, failures)
                sample = TelemetryReported(
                    source=self.kit.source, key=n, occurred_at=now, node_id=n, gpus=reading.gpus, host=host
                )
                self.telemetry.offer(sample)
                self.latest_gpus[n] = reading.gpus
                for g in reading.gpus:
                    if g.xids:
                        seen = self.xids[n].setdefault(g.index, [])
                        seen.extend((now, code) for code in g.xids)
                        del seen[:-32]  # the recent ones are what explains an exit
            if self.reports_hca_ports:
                await self.report_hca_ports()
            await self.telemetry.flush()
            await self._until_next_sample(stop)

    def note_read_failures(self, node_id: str, failures: list[ReadFailure]) -> None:
        """Count each figure that could not be read (per node and kind) and log when a kind starts
        or stops failing on a node, not at every sample."""
        failing = {f.kind: f for f in failures}
        for kind, f in failing.items():
            self.read_failures.labels(node_id=node_id, kind=kind).inc(sum(1 for x in failures if x.kind == kind))
            if (node_id, kind) not in self._failing_reads:
                self._failing_reads.add((node_id, kind))
                log.warning("telemetry read failing", node_id=node_id, kind=kind, gpu_index=f.gpu_index, error=f.error)
        for node, kind in [k for k in self._failing_reads if k[0] == node_id and k[1] not in failing]:
            self._failing_reads.discard((node, kind))
            log.info("telemetry read recovered", node_id=node, kind=kind)

    async def xid_loop(self, stop: asyncio.Event) -> None:
        """Between samples, wait on every NVML backend's XID event set (in threads); an XID makes the
        telemetry loop sample and publish at once, so it reaches the failover controller within a
        second rather than at the next `telemetry_interval_s`."""
        watched = [b for b in self.backends.values() if b.watches_xids]
        if not watched:
            return
        while not stop.is_set():
            got = await asyncio.gather(*(asyncio.to_thread(b.watch_xids, XID_WAIT_S) for b in watched))
            if any(got):
                self.sample_now.set()

    async def _until_next_sample(self, stop: asyncio.Event) -> None:
        """`telemetry_interval_s`, or less when stopping or when a fault was injected meanwhile."""
        waits = [asyncio.ensure_future(e.wait()) for e in (stop, self.sample_now)]
        try:
            await asyncio.wait(waits, timeout=self.cfg.telemetry_interval_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        self.sample_now.clear()

    def inject_xid(self, node_id: str, gpu_index: int, code: int) -> None:
        """A fault drill: the simulated GPU reports XID `code` in a sample sent at once. ValueError when
        injection is off, the node is not hosted here or not simulated, or it has no such GPU."""
        if not self.cfg.fault_injection:
            raise ValueError("fault injection is off (config fault_injection)")
        backend = self.backends.get(node_id)
        if backend is None:
            raise ValueError(f"node {node_id!r} is not hosted here")
        if not isinstance(backend, SimulatedBackend):
            raise ValueError(f"node {node_id!r} runs the {backend.name} backend: only simulated GPUs take XIDs")
        backend.inject_xid(gpu_index, code)
        log.warning("XID injected", node_id=node_id, gpu_index=gpu_index, xid=code)
        self.sample_now.set()

    async def report_hca_ports(self) -> None:
        """This host's InfiniBand ports, for the fabric monitor's link health (telemetry, buffered like samples)."""
        ports, problems = await asyncio.to_thread(read_hca_ports, self.cfg.sysfs_root)
        for where, why in problems:
            if where not in self._hca_problems:  # once per path, not every interval
                self._hca_problems.add(where)
                log.warning("HCA port not read", path=where, reason=why)
        now = self.clock.now()
        for n in self.node_ids:
            self.telemetry.offer(
                HcaPortsReported(source=self.kit.source, key=n, occurred_at=now, node_id=n, ports=ports)
            )

    async def workload_loop(self, stop: asyncio.Event) -> None:
        """Finish simulated work whose time has come and keep the in-memory view current."""
        await repeat_until_stopped(
            stop, WORKLOAD_TICK_S, self.finish_due_work, "workload tick", metrics=self.kit.metrics
        )

    async def prune_loop(self, stop: asyncio.Event) -> None:
        """At start and every `PRUNE_EVERY_S`, delete the workloads that exited before `workload_retention_s`."""
        await repeat_until_stopped(stop, PRUNE_EVERY_S, self.prune_exited, "workload pruning", metrics=self.kit.metrics)

    async def prune_exited(self) -> None:
        gone = await state.prune_exited(self.kit.store.pool, self.kit.config.workload_retention_s, self.node_ids)
        if gone:
            keys = [work_key(allocation_id, node_id) for allocation_id, node_id in gone]
            dirs = await asyncio.to_thread(self.launcher.remove_dirs, keys)
            log.info("exited workloads pruned", deleted=len(gone), work_dirs_removed=dirs)

    async def finish_due_work(self) -> int:
        now = self.clock.now()
        async with self.kit.store.transaction() as tx:
            work = await state.running(tx.conn, self.node_ids)
            due = core.finish_due(work, now=now, source=self.kit.source)
            ended = dict(self.launcher.exited())
            for w in work:
                key = work_key(w.allocation_id, w.node_id)
                if w.launcher == "process" and (key in ended or not self.launcher.watches(key)):
                    code = ended.get(key)
                    xids = [c for i in w.gpu_indices for t, c in self.xids[w.node_id].get(i, []) if t >= w.started_at]
                    due.append((w, core.process_exited(w, code, now=now, source=self.kit.source, xids=xids)))
            for _, exited in due:
                if await state.mark_exited(tx.conn, exited):
                    await tx.outbox(exited)
        finished = {work_key(w.allocation_id, w.node_id) for w, _ in due}
        for w, _ in due:
            self.backends[w.node_id].enforcer.release(w.allocation_id)
        still = [w for w in work if work_key(w.allocation_id, w.node_id) not in finished]
        self.running = {n: [w.allocation_id for w in still if w.node_id == n] for n in self.node_ids}
        load: dict[str, dict[int, int]] = {n: {} for n in self.node_ids}
        for w in still:
            per_gpu = (w.memory_demand_mib or 20_000) // max(1, len(w.gpu_indices))
            for i in w.gpu_indices:
                load[w.node_id][i] = load[w.node_id].get(i, 0) + per_gpu
        self._load = load
        return len(due)


def work_key(allocation_id: str, node_id: str) -> str:
    """One gang member's work: the members of a gang on nodes of this agent share the allocation id."""
    return f"{allocation_id}@{node_id}"
