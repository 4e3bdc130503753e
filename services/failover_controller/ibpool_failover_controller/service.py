"""The failover controller: observations -> ibpool_core.health.decide -> verdict events out, on every tick.

Heartbeats and telemetry are telemetry-class (the next one replaces a lost one), kept in memory
(the newest beat per node, the recent GPU samples). Heartbeats are not stored: a core NATS
subscription reads them as they are sent (`follow_live_in_thread`: on a connection and a thread of
their own, read however busy the ticks keep this loop), and a restarted controller gives every
node a fresh window. Telemetry is read by an ephemeral consumer that starts at the newest sample of
every node (`LAST_PER_SUBJECT`), never at a backlog. Everything that must not be lost (registrations, link events,
job exits, allocations) is taken in by durable transactional consumers, recorded in
`pending_observations` with its inbox row, and handed to the next decision.
A published topology is fetched from the fabric monitor and turned into the link map right away.

Every `tick_interval_s` one transaction takes the decider lock, reads the pending observations,
decides with the buffered beats and `now` (and the `Watch` kept from the last tick: judging looks
only at the nodes late, flagged or changed), and writes the entries the decision changed, the
verdict history and the events to the outbox. A tick runs even when nothing arrived: a heartbeat
that does not come is the signal. Replicas elect the one that decides over NATS KV
(`ibpool_runtime.leader`); its term fences every commit, so a deposed leader that has not noticed
yet cannot overwrite a newer one's decisions. Standbys follow the beats too, so a new leader starts
with a warm picture of who is alive.

With `connection_events_url` (a user of nats-server's system account) the controller also follows
the servers' client connect/disconnect advisories (`ibpool_runtime.connection_events`): an agent
whose last connection closes, a SIGKILLed one say, has its nodes failed `reconnect_grace_s` later
unless it connects again, instead of after the heartbeat window and whatever lag the controller has
on the beats. The connection changes are buffered like beats and handed to the same decision.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import aiohttp
import asyncpg
import msgspec
import nats.js.errors
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ibpool_core.clock import Clock
from ibpool_core.fabric.model import Topology
from ibpool_core.health.connections import (
    ConnectionAdvisory,
    ConnectionChange,
    ConnectionClosed,
    ConnectionOpened,
    LiveConnections,
    OpenConnection,
)
from ibpool_core.health.decide import (
    OBSERVATIONS,
    FailoverConfig,
    FailoverReply,
    FailoverRequest,
    HealthState,
    Observation,
    Watch,
    decide,
    restart_grace,
    with_topology,
)
from ibpool_core.health.link_signals import link_targets
from ibpool_core.health.operator import OperatorAction, OperatorReply, OperatorRequest, act
from ibpool_proto import Message
from ibpool_proto.fabric import LinkDegraded, LinkFlapping, LinkRecovered, LinkStateChanged, TopologyPublished
from ibpool_proto.job import JobExited, JobFinished
from ibpool_proto.node import NodeDeregistered, NodeHeartbeat, NodeRegistered, TelemetryReported
from ibpool_proto.pool import AllocationExpired, AllocationGranted, AllocationReleased, AllocationRevoked
from ibpool_runtime.bus import BusUnavailable
from ibpool_runtime.config import ConfigError
from ibpool_runtime.connection_events import follow_connections
from ibpool_runtime.consumer import HandlerContext, Subscription
from ibpool_runtime.follow import Arrivals, decode_arrivals, follow_latest, follow_live_in_thread
from ibpool_runtime.leader import Leadership
from ibpool_runtime.logs import get_logger
from ibpool_runtime.outages import OUTAGES
from ibpool_runtime.service import Kit, repeat_until_stopped, sleep_unless_stopped

from . import state
from .config import FailoverControllerConfig, core_config

log = get_logger(__name__)

NODE_NEWS = (NodeRegistered, NodeDeregistered)
FABRIC_NEWS = (TopologyPublished, LinkStateChanged, LinkDegraded, LinkFlapping, LinkRecovered)
JOB_NEWS = (JobExited, JobFinished)
POOL_NEWS = (AllocationGranted, AllocationReleased, AllocationRevoked, AllocationExpired)

# What following the connection advisories survives (and tries again after).
FOLLOW_ERRORS: tuple[type[Exception], ...] = (BusUnavailable, *OUTAGES)
# Beats fetched at once.
BEAT_BATCH = 256
# How long a late beat keeps counting in the controller's lag (`beats_lag_s`).
LATE_WINDOW_S = 10.0
# Telemetry samples buffered between two ticks, at most (the oldest go first).
TELEMETRY_BUFFER = 10_000


class FailoverController:
    def __init__(self, kit: Kit[FailoverControllerConfig], clock: Clock) -> None:
        self.kit = kit
        self.cfg = kit.config
        self.clock = clock
        try:
            self.core: FailoverConfig = core_config(self.cfg, kit.source)
        except ValueError as e:
            raise ConfigError(f"invalid failover_controller config: {e}") from None
        self.state = HealthState()
        # What judging must look at, kept from tick to tick (built anew when the state comes from elsewhere).
        self.watch = Watch()
        self.beats: dict[str, NodeHeartbeat] = {}
        # The heartbeats as they arrived, newest per node, read off the bus in a thread of their own
        # (`beats_loop`); each tick takes and decodes them (`take_buffer`).
        self.arrivals = Arrivals()
        # Every heartbeat the server sent before this wall-clock time has been read (`Arrivals`'
        # progress), and beats arrive up to `beats_late` after they were sent: a tick judges silence
        # only up to what it has read, so neither its own lag nor a slow bus or publisher fails a node.
        self.beats_heard_at = self.buffer_heard_at = time.time()
        # (when read, how late after they were sent the beats read since the last report arrived), over
        # the last LATE_WINDOW_S: late beats come in bursts, so the delay counts for a while after each.
        self.beats_late: deque[tuple[float, float]] = deque()
        self.buffer_beats_late = 0.0
        self._lag_logged = 0.0
        self.samples: deque[TelemetryReported] = deque(maxlen=TELEMETRY_BUFFER)
        # Open bus connections per name (nats-server's advisories) and the changes not decided on yet.
        self.connections = LiveConnections()
        self.changes: deque[ConnectionChange] = deque(maxlen=TELEMETRY_BUFFER)
        self.ticks = 0
        self.deciding = False
        self._lock = asyncio.Lock()
        self.leadership: Leadership | None = None
        if self.cfg.leader_election:
            self.leadership = Leadership(
                kit.bus, self.cfg.leader_key, kit.source, self.cfg.leader_ttl_s, self.cfg.stream_replicas
            )
        registry = kit.metrics.registry
        self.verdicts = Counter("ibpool_failover_verdicts", "Verdict events published", ["type"], registry=registry)
        self.decide_seconds = Histogram(
            "ibpool_failover_tick_seconds",
            "Lock, read pending observations, decide and write one tick",
            registry=registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
        )
        self.connection_changes = Counter(
            "ibpool_failover_connection_changes",
            "Bus connection names whose last connection closed, or that opened one again (nats-server's advisories)",
            ["change"],
            registry=registry,
        )
        self.entries_written = Counter(
            "ibpool_failover_state_entries_written",
            "Entries of the health picture written (set or removed): only what a decision changed",
            registry=registry,
        )
        self.judged_nodes = Gauge(
            "ibpool_failover_judged_nodes",
            "Nodes the last tick judged: late, or with a verdict or a closed connection (not every node)",
            registry=registry,
        )
        self.beats_lag = Gauge(
            "ibpool_failover_beats_lag_seconds",
            "How far behind the reading of heartbeats was at the last tick (silence is judged up to there)",
            registry=registry,
        )
        registry.register(_HealthCollector(self))

    def subscriptions(self) -> list[Subscription]:
        p = self.cfg.durable_prefix

        def sub(name: str, types: tuple[type[Message], ...]) -> Subscription:
            return Subscription(f"{p}-{name}", tuple(t.subject_pattern() for t in types), self.on_news)

        return [
            sub("nodes", NODE_NEWS),
            sub("fabric", FABRIC_NEWS),
            sub("jobs", JOB_NEWS),
            sub("pool", POOL_NEWS),
        ]

    async def beats_loop(self, stop: asyncio.Event) -> None:
        """Follow heartbeats and telemetry from the newest of every node on, until `stop`."""

        def on_message(message: object) -> None:
            if isinstance(message, NodeHeartbeat | TelemetryReported):
                self.on_beat(message)

        await asyncio.gather(
            # Heartbeats are not stored: followed live on core NATS, on a connection and a thread of
            # their own, so that a long decision (a cluster starting: thousands of registrations)
            # never stops them being read and nats-server never drops the controller as a slow consumer.
            follow_live_in_thread(
                self.kit.bus, NodeHeartbeat.subject_pattern(), stop, self.arrivals, name=f"{self.kit.source}/beats"
            ),
            follow_latest(
                self.kit.bus,
                TelemetryReported.subject_pattern(),
                stop,
                on_message,
                batch=BEAT_BATCH,
                metrics=self.kit.metrics,
            ),
        )

    async def connections_loop(self, stop: asyncio.Event) -> None:
        """Follow nats-server's connection advisories until `stop` (nothing without `connection_events_url`)."""
        if not self.cfg.connection_events_url:
            log.info("no connection_events_url: agents' deaths are seen through missing heartbeats only")
            return

        def on_advisory(advisory: ConnectionAdvisory) -> None:
            self.take_change(self.connections.apply(advisory))

        def on_open(connections: list[OpenConnection]) -> None:
            for change in self.connections.sync(connections, self.clock.now()):
                self.take_change(change)

        while not stop.is_set():
            try:
                await follow_connections(
                    self.cfg.connection_events_url,
                    name=f"{self.kit.source}/connections",
                    stop=stop,
                    on_advisory=on_advisory,
                    on_open=on_open,
                    tls_ca=self.cfg.nats_tls_ca,
                    metrics=self.kit.metrics,
                )
            except FOLLOW_ERRORS as e:
                self.kit.metrics.loop_failed("connection advisories", e)
                log.warning("cannot follow connection advisories", error=str(e) or type(e).__name__)
                await sleep_unless_stopped(stop, 2.0)

    def take_change(self, change: ConnectionChange | None) -> None:
        if change is None:
            return
        self.connection_changes.labels("closed" if isinstance(change, ConnectionClosed) else "opened").inc()
        self.changes.append(change)

    def beats_lag_s(self) -> float:
        """How far behind now the heartbeats of the last `take_buffer` are: a beat sent before
        `now - lag` has been read (0: caught up). The follower's own lag plus how late after they were
        sent the beats it read last arrived."""
        return max(0.0, time.time() - self.buffer_heard_at) + self.buffer_beats_late

    def on_beat(self, message: NodeHeartbeat | TelemetryReported) -> None:
        match message:
            case NodeHeartbeat():
                old = self.beats.get(message.node_id)
                if old is None or message.occurred_at >= old.occurred_at:
                    self.beats[message.node_id] = message
            case TelemetryReported():
                self.samples.append(message)

    async def on_news(self, message: object, ctx: HandlerContext) -> None:
        assert ctx.tx is not None
        if isinstance(message, TopologyPublished):
            await self.take_topology(message, ctx)
        elif isinstance(message, OBSERVATIONS):
            await state.add_pending(ctx.tx.conn, message)

    async def take_topology(self, published: TopologyPublished, ctx: HandlerContext) -> None:
        """Fetch the published topology and store its link map; a failed fetch is retried (nak)."""
        assert ctx.tx is not None
        if published.url is None:
            log.warning("topology published without a URL; link verdicts keep the old map", version=published.version)
            return
        timeout = aiohttp.ClientTimeout(total=self.cfg.topology_fetch_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http, http.get(published.url) as r:
            r.raise_for_status()
            topology = msgspec.json.decode(await r.read(), type=Topology)
        targets = await asyncio.to_thread(link_targets, topology)
        await state.save_link_targets(ctx.tx.conn, published.version, targets)
        log.info("link map updated", version=published.version, links=len(targets))

    def take_buffer(self) -> list[Observation]:
        """The beats and samples read since the last take; `buffer_heard_at` is when they were
        complete up to (what `beats_lag_s` measures from)."""
        arrived, heard_at = self.arrivals.take()
        decoded, late = decode_arrivals(arrived)
        for message in decoded:
            if isinstance(message, NodeHeartbeat):
                self.on_beat(message)
        self.beats_heard_at = max(self.beats_heard_at, heard_at)
        now = time.time()
        if late > 0.0:
            self.beats_late.append((now, late))
        beats: list[Observation] = [*self.samples, *self.beats.values(), *self.changes]
        self.samples.clear()
        self.beats = {}
        self.changes.clear()
        self.buffer_heard_at = self.beats_heard_at
        while self.beats_late and self.beats_late[0][0] < now - LATE_WINDOW_S:
            self.beats_late.popleft()
        self.buffer_beats_late = max((late for _, late in self.beats_late), default=0.0)
        return beats

    def give_back(self, buffered: list[Observation]) -> None:
        for o in buffered:
            if isinstance(o, NodeHeartbeat):
                old = self.beats.get(o.node_id)
                if old is None or o.occurred_at > old.occurred_at:
                    self.beats[o.node_id] = o
            elif isinstance(o, TelemetryReported):
                self.samples.appendleft(o)
        self.changes.extendleft(reversed([o for o in buffered if isinstance(o, ConnectionClosed | ConnectionOpened)]))

    async def tick_once(self) -> FailoverReply | None:
        """One decision over what arrived and the clock; None when another replica holds the lock."""
        if self.leadership is not None and not self.leadership.is_leader:
            self.deciding = False  # standing by: beats keep arriving, the leader decides
            self.changes.clear()  # a new leader judges connections it did not see change by heartbeats
            return None
        async with self._lock:
            started = time.perf_counter()
            buffered = self.take_buffer()
            try:
                reply = await self._decide_and_commit(buffered)
            except BaseException:
                self.give_back(buffered)
                raise
            self.decide_seconds.observe(time.perf_counter() - started)
            return reply

    async def _decide_and_commit(self, buffered: list[Observation]) -> FailoverReply | None:
        async with self.kit.store.transaction() as tx:
            if not await state.lock(tx.conn, self.kit.store.schema):
                self.deciding = False
                return None
            term = self.leadership.term if self.leadership is not None else None
            if self.leadership is not None and (term is None or not await state.fence(tx.conn, term)):
                self.leadership.step_down("a newer leader has decided (fenced)")
                self.deciding = False
                return None
            if not self.deciding:
                await self.take_over(tx.conn)
                # Closes seen before this replica decided: restart_grace hands those nodes to the heartbeat rule.
                buffered = [o for o in buffered if not isinstance(o, ConnectionClosed)]
            base = self.state
            newer = await state.link_targets_after(tx.conn, base.topology_version)
            if newer is not None:
                base = with_topology(base, newer[1], newer[0])
            pending, last_seq = await state.take_pending(tx.conn)
            now = self.clock.now()
            lag = self.beats_lag_s()
            self.beats_lag.set(lag)
            if lag > self.core.heartbeat.fail_after_s and time.monotonic() - self._lag_logged > 5.0:
                self._lag_logged = time.monotonic()
                log.warning(
                    "behind the heartbeats: silence is judged only up to what was read",
                    lag_s=round(lag, 2),
                    late_s=round(self.buffer_beats_late, 2),
                )
            reply = decide(
                FailoverRequest(
                    state=base, now=now, observations=[*pending, *buffered], config=self.core, beats_lag_s=lag
                ),
                self.watch,
            )
            if last_seq is not None:
                await state.drop_pending(tx.conn, last_seq)
            # Only what the decision changed is written: a cluster beating on time writes nothing.
            if reply.changes or newer is not None:
                self.entries_written.inc(await state.save_changes(tx.conn, reply.state, reply.changes, now))
            if reply.events:
                await tx.outbox(*reply.events)
                await state.record_verdicts(tx.conn, reply.events, self.cfg.verdict_history)
        self.state = reply.state
        self.judged_nodes.set(self.watch.judged)
        self.ticks += 1
        for e in reply.events:
            self.verdicts.labels(type(e).__name__).inc()
            log.info("verdict", type=type(e).__name__, key=e.key, reason=getattr(e, "reason", ""))
        for note in reply.notes:
            log.info("observed, no action", note=note)
        return reply

    async def take_over(self, conn: asyncpg.Connection) -> None:
        """Start deciding (this process's start, or another replica stopped): the picture as last
        committed, with a fresh heartbeat window for every node; one saved whole is written anew."""
        saved, whole = await state.load_state(conn)
        if whole:
            await state.save_whole(conn, saved, self.clock.now())
        self.state = restart_grace(saved, self.clock.now())
        self.deciding = True

    async def operate(self, action: OperatorAction) -> OperatorReply | NotDeciding:
        """Apply an operator's action under the decider lock and the leader's fence, state and events in one
        transaction; NotDeciding (with who leads, when known) on a replica that is not the leader."""
        if self.leadership is not None and not self.leadership.is_leader:
            return NotDeciding(leader=await self.leader_identity())
        async with self._lock, self.kit.store.transaction() as tx:
            if not await state.lock(tx.conn, self.kit.store.schema):
                return NotDeciding(leader=await self.leader_identity())
            term = self.leadership.term if self.leadership is not None else None
            if self.leadership is not None and (term is None or not await state.fence(tx.conn, term)):
                self.leadership.step_down("a newer leader has decided (fenced)")
                self.deciding = False
                return NotDeciding(leader=await self.leader_identity())
            if not self.deciding:
                await self.take_over(tx.conn)
            now = self.clock.now()
            reply = act(OperatorRequest(state=self.state, now=now, action=action, config=self.core))
            if reply.events:
                self.entries_written.inc(await state.save_changes(tx.conn, reply.state, reply.changes, now))
                await tx.outbox(*reply.events)
                await state.record_verdicts(tx.conn, reply.events, self.cfg.verdict_history)
        self.state = reply.state
        for e in reply.events:
            self.verdicts.labels(type(e).__name__).inc()
        log.info("operator action", action=type(action).__name__, outcome=reply.outcome, detail=reply.detail)
        return reply

    async def leader_identity(self) -> str | None:
        """Who holds the leader key now (its source name), None when nobody or unknown."""
        if self.leadership is None:
            return None
        try:
            entry = await (await self.leadership.bucket()).get(self.leadership.key)
        except nats.js.errors.NotFoundError:  # no key, or its TTL ended it: no leader right now
            return None
        except OUTAGES as e:  # the bus is away: not known
            self.kit.metrics.loop_failed("leader lookup", e)
            return None
        return entry.value.decode() if entry.value else None

    async def leader_loop(self, stop: asyncio.Event) -> None:
        if self.leadership is not None:
            await self.leadership.run(stop)

    async def tick_loop(self, stop: asyncio.Event) -> None:
        await repeat_until_stopped(stop, self.cfg.tick_interval_s, self.tick_once, "tick", metrics=self.kit.metrics)


class NotDeciding(msgspec.Struct, frozen=True, kw_only=True):
    """This replica does not decide now; `leader` is the one that does, when known."""

    leader: str | None


class _HealthCollector(Collector):
    """Nodes per verdict and the split-brain guard, read from memory at scrape time."""

    def __init__(self, controller: FailoverController) -> None:
        self.controller = controller

    def collect(self):  # type: ignore[no-untyped-def]
        nodes = GaugeMetricFamily("ibpool_failover_nodes", "Nodes per health verdict", labels=["status"])
        counts = {"healthy": 0, "suspect": 0, "failed": 0}
        for n in self.controller.state.nodes.values():
            counts[n.status] += 1
        for status, count in counts.items():
            nodes.add_metric([status], count)
        degraded = GaugeMetricFamily(
            "ibpool_failover_cluster_degraded", "1 while more nodes are unreachable than may be failed at once"
        )
        degraded.add_metric([], 1.0 if self.controller.state.degraded else 0.0)
        yield nodes
        yield degraded
