"""The failover decision: `decide(FailoverRequest) -> FailoverReply`, data in and data out.

A request is the controller's whole picture (`HealthState`: nodes with their GPUs and cordons, the
links and what depends on them, who holds which GPUs, jobs hit by hardware), the observations that
arrived since the last decision (bus events, in arrival order), `now` and the config. The reply is
the new state and the events to publish. The same function runs on every batch of observations and
on a timer with none: heartbeats that do not arrive are a signal only the clock can see.

Verdicts and their actions:

- Node: late heartbeats -> `suspect` (NodeSuspected); lost heartbeats, or an XID that needs a
  reboot -> `failed` (NodeFailed, Cordoned node, DrainRequested, RequeueRequested for the work
  there). A suspected node is cleared (NodeRecovered) after `clear_after_beats` intervals on time; a
  failed one after the stable window (NodeRecovered, Uncordoned), which doubles with each failure
  inside `flap_memory_s` (up to `max_hold_s`), so a flapping node is held longer each time. A node
  failed by an XID waits for a re-registration (a reboot) before its window starts. A node an
  operator drained (`operator_drain`) or cordoned (`operator_cordon`) keeps its node cordon through
  all of this; only the operator lifts it (`ibpool_core.health.operator`).
- GPU: an XID that needs a reset, retired pages or lifetime ECC errors at their limit -> GpuFailed
  and Cordoned gpu, and the work holding that GPU is requeued; the node's other GPUs keep working.
  Volatile ECC errors and heat -> Cordoned gpu only, lifted (Uncordoned) once the GPU looked fine
  for the stable window. A re-registration (reboot, GPU reset) clears the GPU verdicts; an
  operator's GPU cordon (`GpuHealth.operator_cordon`) stays through both.
- Link: a host's cable down/flapping (or degraded, by config) -> Cordoned rail of that host; a leaf
  uplink -> Cordoned leaf for each host under the leaf (multi-node work only). Lifted when the fabric
  monitor reports the problem gone (it applies its own hysteresis).
- Jobs: each hardware hit counts against the job; RequeueRequested carries the attempt and an
  exponential `retry_after_s`; at `flag_after_failures` JobFlagged (once); past `max_requeues` no
  more requeues are asked for.
- A node that deregistered left cleanly: it is forgotten, and beats or registrations it sent before
  it left (still in flight) are ignored. A heartbeat or sample older than the fail window from a
  node not known (the controller starts and reads the newest beat of every node ever seen) says
  nothing about now and is ignored. A node first seen through a recent observation gets a full
  heartbeat window. A telemetry sample not newer than the newest one judged for its node is a replay
  (the telemetry consumer starts again at the newest sample of every node) and is not judged twice, so
  an XID an operator already dealt with does not fail the GPU or node again.
- Lag: a heartbeat is judged missing only up to the time the controller has read every heartbeat
  stored before (`now - beats_lag_s`): a controller that falls behind its input sees nodes late by
  its own lag, not by theirs, so it never suspects or fails a node on the strength of heartbeats it
  has not read yet (the silence it can vouch for is what counts).
- Connections: nats-server reports when a client's last bus connection closes
  (`ibpool_core.health.connections`); every node whose newest word came from that agent (its
  `source`, which is the connection's name) and that has not been heard from since is lost once
  `reconnect_grace_s` passed without the agent connecting again or a word it sent after the close
  arriving. A killed agent is so failed in about the grace, not the heartbeat window, and whatever
  lag the controller has on the beats. A hung agent keeps its connection: the heartbeat rule finds it.
- Split brain: heartbeat failures are declared only while the failed nodes and the nodes late
  right now (suspected, whether lost yet or not, or with their connection closed within the grace)
  stay within `max(min_failed_allowed, floor(max_failed_fraction * nodes))`; connection failures
  only while the failed nodes and the nodes cut off right now (connection closed, within the grace
  or suspected for it and not cleared yet) do, so heartbeats late for a shared reason do not hold
  back the server's word on one dead agent, but a server that drops many clients at once fails
  none. Past a limit, those failures wait, the nodes stay suspected and ClusterDegraded is raised
  (once); ClusterRestored when both counts are back within the limit. Suspicions the heartbeat
  rule makes while past the limit are not sent one by one (a stalled bus or publisher would send
  thousands): ClusterDegraded names the nodes, and their clearing sends no NodeRecovered. Failures reported by a node
  itself (XID 79) are not held back.

Bounded by what changed: the reply names the entries of the state the decision set or removed
(`StateChanges`; a beat that only moves a node's time later is not one), so a store writes only
those; and with the caller's `Watch` (kept from one decision to the next) judging looks only at the
nodes that are late, carry a verdict or changed, not at every node. The reply is the same with or
without a watch.

Pure: no I/O, no wall clock, no randomness. Event ids derive from what caused them
(`ibpool_core.ids.EventIds`): the observation's id for what an observation did, `clock/<verdict>`
for what the clock decided (`clock/heartbeat`: a node's suspicion, recovery or lifted GPU cordons,
`clock/lost`: a node failed by silence, `clock/cluster`: the split-brain guard), with the event's
key and its position among the decision's events. The same request gives the same reply, byte
for byte, so JetStream's duplicate window drops a recomputed event.
"""

from __future__ import annotations

import datetime as dt
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Generic, Literal, TypedDict, TypeVar

import msgspec

from ibpool_proto.fabric import LinkDegraded, LinkFlapping, LinkRecovered, LinkStateChanged
from ibpool_proto.health import (
    ClusterDegraded,
    ClusterRestored,
    Cordoned,
    CordonScope,
    DrainRequested,
    GpuFailed,
    JobFlagged,
    NodeFailed,
    NodeRecovered,
    NodeSuspected,
    RequeueRequested,
    Uncordoned,
)
from ibpool_proto.job import JobExited, JobFinished
from ibpool_proto.message import Event
from ibpool_proto.node import NodeDeregistered, NodeHeartbeat, NodeRegistered, TelemetryReported
from ibpool_proto.pool import AllocationExpired, AllocationGranted, AllocationReleased, AllocationRevoked

from ..ids import EventIds
from .connections import ConnectionClosed, ConnectionOpened
from .gpu_signals import GpuRules, judge_gpu
from .heartbeat import HeartbeatRules, clear_after_s, liveness
from .job_exits import RetryRules, blame, flagged, may_requeue, requeue_backoff_s
from .link_signals import LinkTarget, cordoning_problems
from .xid import XidAction

Observation = (
    NodeRegistered
    | NodeDeregistered
    | NodeHeartbeat
    | TelemetryReported
    | LinkStateChanged
    | LinkDegraded
    | LinkFlapping
    | LinkRecovered
    | JobExited
    | JobFinished
    | AllocationGranted
    | AllocationReleased
    | AllocationRevoked
    | AllocationExpired
    | ConnectionClosed
    | ConnectionOpened
)
# What arrives on the bus (the connection changes come from nats-server's advisories, not as events).
OBSERVATIONS: tuple[type[Event], ...] = tuple(t for t in Observation.__args__ if issubclass(t, Event))

NodeStatus = Literal["healthy", "suspect", "failed"]


class GpuHealth(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    failed: bool = False
    cordoned: bool = False
    reason: str = ""
    xid: int | None = None
    # Since when the GPU has looked fine while cordoned (the cordon lifts after the stable window).
    fine_since: dt.datetime | None = None
    # Cordoned by an operator (who and why): the cordon stays, whatever the GPU's samples or a
    # re-registration say, until an operator lifts it (uncordon or recover).
    operator_cordon: str = ""


class NodeHealth(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    status: NodeStatus = "healthy"
    reason: str = ""
    # When the status was entered.
    since: dt.datetime | None = None
    interval_s: float = 1.0
    last_beat: dt.datetime | None = None
    # While suspected or failed: since when every signal has been good.
    healthy_since: dt.datetime | None = None
    # Failed by an XID that needs a reboot: recovery waits for a re-registration.
    needs_reboot: bool = False
    cordoned: bool = False
    # Failures inside the flap memory, the last one's time and the stable window it earned.
    failures: int = 0
    last_failed_at: dt.datetime | None = None
    hold_s: float = 0.0
    gpus: dict[int, GpuHealth] = {}
    # rail -> ids of the links that keep it cordoned; ids of the leaf uplinks that cordon the node.
    rail_cordons: dict[int, list[str]] = {}
    leaf_cordons: list[str] = []
    # GPUs the node registered with (None: not known yet); an operator action names one of them.
    gpu_count: int | None = None
    # Drained by an operator (who and why): the node cordon stays until an operator puts it back.
    operator_drain: str = ""
    # Cordoned by an operator without draining (who and why): no new work, the work there stays;
    # like a drain, the cordon outlives every verdict until an operator lifts it.
    operator_cordon: str = ""
    # When the newest telemetry judged was taken (no later than the controller's clock then): one not
    # newer is a replay (a consumer that started again at the newest sample of every node), not judged twice.
    telemetry_at: dt.datetime | None = None
    # The `source` of the node's newest registration or beat: its agent, and that agent's bus connection name.
    source: str = ""
    # When its agent's last bus connection closed (nats-server's clock), while no new one opened and
    # no beat sent after that arrived: lost after `reconnect_grace_s`.
    connection_closed_at: dt.datetime | None = None
    # Suspected because its connection closed and did not reopen in the grace: until it is cleared,
    # it counts among the connections lost at once (the split-brain guard on connections).
    cut_off: bool = False
    # Suspected by the heartbeat rule while more of the cluster was late than may fail (a shared
    # cause): no NodeSuspected was sent for it, ClusterDegraded said it for all, so its clearing
    # sends no NodeRecovered either.
    suspected_quietly: bool = False


class Holding(msgspec.Struct, frozen=True, kw_only=True):
    """An allocation's GPUs on one node."""

    allocation_id: str
    job_id: str
    node_id: str
    gpu_indices: list[int]


# The memory of finished jobs is bounded in count too (the picture stays bounded whatever the churn);
# under a churn above this many ends per `finished_memory_s` the window shrinks.
FINISHED_KEPT = 1_000


class JobRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A job hit by hardware: how often, where, and the allocations already counted."""

    job_id: str
    failures: int = 0
    flagged: bool = False
    node_ids: list[str] = []
    counted: list[str] = []


class HealthState(msgspec.Struct, frozen=True, kw_only=True):
    nodes: dict[str, NodeHealth] = {}
    links: dict[str, LinkTarget] = {}
    topology_version: int = 0
    # link id -> its active problems, as the fabric monitor reported them
    link_problems: dict[str, list[str]] = {}
    # "<allocation id>/<node id>" -> the GPUs it holds there
    holdings: dict[str, Holding] = {}
    jobs: dict[str, JobRecord] = {}
    degraded: bool = False
    # node id -> when it deregistered: its beats from before then (still in flight) are its last words
    departed: dict[str, dt.datetime] = {}
    # job id -> when it finished (JobFinished): a hit that comes later (the job and pool streams are
    # not ordered against each other; a gang's other members exit after it) is not counted
    finished: dict[str, dt.datetime] = {}


class FailoverConfig(msgspec.Struct, frozen=True, kw_only=True):
    source: str = "failover_controller"
    # The subject key of cluster-wide events.
    cluster: str = "cluster"
    heartbeat: HeartbeatRules = msgspec.field(default_factory=HeartbeatRules)
    gpu: GpuRules = msgspec.field(default_factory=GpuRules)
    retry: RetryRules = msgspec.field(default_factory=RetryRules)
    xid_overrides: dict[int, XidAction] = {}
    # A failed node (or a cordoned GPU) must look healthy this long before it is put back.
    stable_window_s: float = 30.0
    max_hold_s: float = 3600.0
    # Failures closer together than this count as flapping (the window doubles each time).
    flap_memory_s: float = 3600.0
    # How long a finished job is remembered (at most FINISHED_KEPT of them): hardware hits that reach
    # the controller after the job's end are not counted against it.
    finished_memory_s: float = 600.0
    max_failed_fraction: float = 0.2
    min_failed_allowed: int = 1
    cordon_degraded_links: bool = True


class FailoverRequest(msgspec.Struct, frozen=True, kw_only=True):
    """`beats_lag_s`: how far behind the controller's reading of heartbeats is: every heartbeat
    stored before `now - beats_lag_s` has been observed (0: it is caught up). Silence is judged up
    to that time only."""

    state: HealthState
    now: dt.datetime
    observations: list[Observation] = []
    config: FailoverConfig = msgspec.field(default_factory=FailoverConfig)
    beats_lag_s: float = 0.0


class StateChanges(msgspec.Struct, frozen=True, kw_only=True):
    """The keys of the state's maps a decision set or removed, in key order: what a store that keeps
    the state entry by entry writes (`HealthState.nodes` ... `link_problems`), and `scalars` when
    `degraded` or `topology_version` moved. A node's heartbeat and telemetry times alone are not a
    change: `restart_grace` gives every node a fresh window on a restart, and a sample that changed
    nothing else judges the same when read again, so a quiet cluster writes nothing."""

    nodes: list[str] = []
    holdings: list[str] = []
    jobs: list[str] = []
    departed: list[str] = []
    finished: list[str] = []
    link_problems: list[str] = []
    scalars: bool = False

    def __bool__(self) -> bool:
        return bool(
            self.scalars
            or self.nodes
            or self.holdings
            or self.jobs
            or self.departed
            or self.finished
            or self.link_problems
        )


# The maps of `HealthState` kept entry by entry (`StateChanges` names the same).
STATE_MAPS = ("nodes", "holdings", "jobs", "departed", "finished", "link_problems")


class FailoverReply(msgspec.Struct, frozen=True, kw_only=True):
    state: HealthState
    events: list[Event] = []
    # What was seen and deliberately not acted on (unknown links, application XIDs ...), for logs.
    notes: list[str] = []
    changes: StateChanges = msgspec.field(default_factory=StateChanges)


def decide(request: FailoverRequest, watch: Watch | None = None) -> FailoverReply:
    """Apply the observations in order, then judge every node against the clock. See the module docstring.

    `watch`: the caller's `Watch`, kept from the previous decision, so that judging looks only at the
    nodes that changed, are late or carry a verdict instead of walking every node; the reply is the
    same with or without it."""
    d = _Decision(request, watch)
    for obs in request.observations:
        d.observe(obs)
    d.judge_nodes()
    return FailoverReply(state=d.state(), events=d.events, notes=d.notes, changes=d.changes())


def restart_grace(state: HealthState, now: dt.datetime) -> HealthState:
    """A controller that (re)starts gives every node a fresh heartbeat window from `now`.

    It did not listen while it was down, so an old last beat says nothing about the node, and a
    connection it saw close may have been opened again unseen: the heartbeat rule judges those.
    """

    def fresh(n: NodeHealth) -> NodeHealth:
        last_beat = now if n.last_beat is not None and n.last_beat < now else n.last_beat
        if last_beat == n.last_beat and n.connection_closed_at is None:
            return n
        return msgspec.structs.replace(n, last_beat=last_beat, connection_closed_at=None)

    return msgspec.structs.replace(state, nodes={k: fresh(n) for k, n in state.nodes.items()})


def pool_size(nodes: Iterable[NodeHealth]) -> int:
    """Nodes that ever beat; fabric hosts without an agent are not part of the pool."""
    return sum(1 for n in nodes if n.last_beat is not None)


def failed_allowed(pool: int, config: FailoverConfig) -> int:
    """How many of a pool of `pool` nodes may be failed by missing heartbeats at once (the split-brain guard)."""
    return max(config.min_failed_allowed, math.floor(config.max_failed_fraction * pool))


def max_failed_nodes(nodes: Iterable[NodeHealth], config: FailoverConfig) -> int:
    """`failed_allowed` for these nodes."""
    return failed_allowed(pool_size(nodes), config)


def with_topology(state: HealthState, targets: dict[str, LinkTarget], version: int) -> HealthState:
    """The state with the link map of a new topology version (cordons already applied stay)."""
    return msgspec.structs.replace(state, links=dict(targets), topology_version=version)


_K = TypeVar("_K")
_V = TypeVar("_V")


class _Tracked(dict[_K, _V], Generic[_K, _V]):
    """A map of the state that remembers the keys set or removed: `changed` for the store, `fresh`
    (changed since the `Watch` last looked) for the watch. A key given only a later heartbeat or
    telemetry time is set quietly (`set_quietly`): neither."""

    def __init__(self, items: dict[_K, _V]) -> None:
        super().__init__(items)
        self.changed: set[_K] = set()
        self.fresh: set[_K] = set()

    def __setitem__(self, key: _K, value: _V) -> None:
        self.changed.add(key)
        self.fresh.add(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: _K) -> None:
        self.changed.add(key)
        self.fresh.add(key)
        super().__delitem__(key)

    def discard(self, key: _K) -> _V | None:
        """Remove `key` if present; its value, else None."""
        if key not in self:
            return None
        value = self[key]
        del self[key]
        return value

    def set_quietly(self, key: _K, value: _V) -> None:
        super().__setitem__(key, value)


def needs_attention(n: NodeHealth) -> bool:
    """A node judging must look at whatever its heartbeats: not healthy, a GPU verdict, its connection closed."""
    return n.status != "healthy" or bool(n.gpus) or n.connection_closed_at is not None


class Watch:
    """What judging must look at, kept by the caller from one decision to the next so that a tick does
    not walk every node: the nodes that need attention whatever their beats (`needs_attention`), the
    healthy ones that may be late, the ones that ever beat (the pool's size), and a heap of heartbeat
    deadlines (last beat + the suspect window, as Unix seconds) with one live entry per other node.

    A beat only moves a node's deadline later, so it does not touch the watch: the node's entry comes
    due at its old deadline, and is then put back at the node's current one (or the node may be late).
    A node is looked at again only when a decision changes it (`_Tracked.fresh`). The work per tick is
    so the nodes changed, late or flagged, plus one heap step per node per suspect window, not the
    cluster. The watch only chooses whom to judge, erring towards more (a deadline within `SLACK_S`
    of the time judged counts as late); judging itself decides on the exact times, so a decision is
    the same with or without it. It describes one state's nodes (the map it last saw, by identity):
    given another, or other heartbeat rules, it is built anew from every node."""

    # Deadlines this close to the time judged are judged (float seconds against exact datetimes).
    SLACK_S = 0.001

    def __init__(self) -> None:
        self.nodes: dict[str, NodeHealth] | None = None
        self.suspect_after_intervals = 0.0
        self.attention: set[str] = set()
        self.late: set[str] = set()
        self.pool: set[str] = set()
        self.deadlines: list[tuple[float, str]] = []
        # node id -> the deadline of its live entry in `deadlines` (other entries of it are stale)
        self.queued: dict[str, float] = {}
        self.builds = 0  # how often it was built from every node (tests pin that a tick does not)
        self.judged = 0  # how many nodes the last decision judged

    def deadline(self, n: NodeHealth) -> float | None:
        if n.last_beat is None:
            return None
        return n.last_beat.timestamp() + self.suspect_after_intervals * n.interval_s

    def build(self, nodes: dict[str, NodeHealth], suspect_after_intervals: float) -> None:
        self.suspect_after_intervals = suspect_after_intervals
        self.attention, self.late, self.pool, self.deadlines, self.queued = set(), set(), set(), [], {}
        self.builds += 1
        for node_id, n in nodes.items():
            self.update(node_id, n)
        self.nodes = nodes

    def update(self, node_id: str, n: NodeHealth | None) -> None:
        """Node `node_id` is now `n` (None: gone)."""
        if n is None:
            self.attention.discard(node_id)
            self.late.discard(node_id)
            self.pool.discard(node_id)
            self.queued.pop(node_id, None)
            return
        if n.last_beat is not None:
            self.pool.add(node_id)
        else:
            self.pool.discard(node_id)
        if needs_attention(n):
            self.attention.add(node_id)
            self.late.discard(node_id)
            self.queued.pop(node_id, None)
            return
        self.attention.discard(node_id)
        if node_id not in self.late:
            self._queue(node_id, self.deadline(n))

    def _queue(self, node_id: str, due: float | None) -> None:
        if due is None:
            self.queued.pop(node_id, None)
            return
        queued = self.queued.get(node_id)
        if queued is None or due < queued:  # a later deadline is found when the entry comes due
            self.queued[node_id] = due
            heapq.heappush(self.deadlines, (due, node_id))

    def to_judge(self, nodes: dict[str, NodeHealth], heard: dt.datetime) -> list[str]:
        """The nodes judging must look at, in id order: those needing attention and those that may be
        late at `heard`."""
        until = heard.timestamp() + self.SLACK_S
        deadlines, queued = self.deadlines, self.queued
        while deadlines and deadlines[0][0] < until:
            due, node_id = heapq.heappop(deadlines)
            if queued.get(node_id) != due:
                continue  # stale: the node's live entry is another one, or it has none
            del queued[node_id]
            n = nodes.get(node_id)
            now_due = None if n is None else self.deadline(n)
            if now_due is None:
                continue
            if now_due < until:
                self.late.add(node_id)
            else:
                self._queue(node_id, now_due)  # it beat since: due again at its current deadline
        for node_id in list(self.late):
            n = nodes.get(node_id)
            now_due = None if n is None else self.deadline(n)
            if n is None or node_id in self.attention or now_due is None or now_due >= until:
                # Back on time (a beat, or less lag than before): watched by its deadline again.
                self.late.discard(node_id)
                if node_id not in self.attention:
                    self._queue(node_id, now_due)
        judged = sorted(self.attention | self.late)
        self.judged = len(judged)
        return judged


class _Envelope(TypedDict):
    id: str
    source: str
    key: str
    occurred_at: dt.datetime


class _Decision:
    def __init__(self, request: FailoverRequest, watch: Watch | None = None) -> None:
        s = request.state
        self.before = s
        self.cfg = request.config
        self.now = request.now
        # Up to when every heartbeat has been read: silence is judged against this, not `now`.
        self.heard = request.now - dt.timedelta(seconds=max(0.0, request.beats_lag_s))
        self.nodes = _Tracked(s.nodes)
        self.links = s.links
        self.topology_version = s.topology_version
        self.link_problems = _Tracked(s.link_problems)
        self.holdings = _Tracked(s.holdings)
        self.jobs = _Tracked(s.jobs)
        self.degraded = s.degraded
        self.departed = _Tracked(s.departed)
        self.finished = _Tracked(s.finished)
        self.watch = watch
        if watch is not None and (
            watch.nodes is not s.nodes or watch.suspect_after_intervals != self.cfg.heartbeat.suspect_after_intervals
        ):
            watch.build(s.nodes, self.cfg.heartbeat.suspect_after_intervals)
        self.events: list[Event] = []
        self.notes: list[str] = []
        # What the events made now answer (see the module docstring); the ids number every event.
        self.cause = "clock/heartbeat"
        self.ids = EventIds(request.now)
        # source -> its nodes, built when a connection change first needs it (see `nodes_of`).
        self._by_source: dict[str, list[str]] | None = None

    def state(self) -> HealthState:
        return HealthState(
            nodes=self.nodes,
            links=self.links,
            topology_version=self.topology_version,
            link_problems=self.link_problems,
            holdings=self.holdings,
            jobs=self.jobs,
            degraded=self.degraded,
            departed=self.departed,
            finished=self.finished,
        )

    def changes(self) -> StateChanges:
        return StateChanges(
            nodes=sorted(self.nodes.changed),
            holdings=sorted(self.holdings.changed),
            jobs=sorted(self.jobs.changed),
            departed=sorted(self.departed.changed),
            finished=sorted(self.finished.changed),
            link_problems=sorted(self.link_problems.changed),
            scalars=self.degraded != self.before.degraded or self.topology_version != self.before.topology_version,
        )

    def watch_nodes(self) -> None:
        """Bring the watch up to date with the nodes touched since it last was."""
        if self.watch is None:
            return
        self.watch.nodes = self.nodes  # what it describes from now on: the map the reply's state holds
        for node_id in self.nodes.fresh:
            self.watch.update(node_id, self.nodes.get(node_id))
        self.nodes.fresh.clear()

    # -- envelope --------------------------------------------------------------------------------

    def env(self, key: str) -> _Envelope:
        return {
            "id": self.ids.next(f"{self.cause}/{key}"),
            "source": self.cfg.source,
            "key": key,
            "occurred_at": self.now,
        }

    def emit(self, *events: Event) -> None:
        self.events.extend(events)

    def node(self, node_id: str, *, seen: bool = True) -> NodeHealth:
        """The node's health, created when first met; `seen=False` (a fabric host) starts no heartbeat window."""
        n = self.nodes.get(node_id)
        if n is None:
            n = NodeHealth(node_id=node_id, since=self.now, last_beat=self.now if seen else None)
            self.nodes[node_id] = n
        elif seen and n.last_beat is None:
            n = self.put(msgspec.structs.replace(n, last_beat=self.now))
        return n

    def put(self, n: NodeHealth) -> NodeHealth:
        self.nodes[n.node_id] = n
        return n

    def put_times(self, n: NodeHealth) -> NodeHealth:
        """`n` differs from the node's record only in its heartbeat or telemetry time (see `StateChanges`)."""
        self.nodes.set_quietly(n.node_id, n)
        return n

    def seen_at(self, at: dt.datetime) -> dt.datetime:
        # A node whose clock runs ahead cannot push its last beat into our future.
        return min(at, self.now)

    # -- observations ----------------------------------------------------------------------------

    def observe(self, obs: Observation) -> None:
        self.cause = f"{type(obs).__name__}/{obs.id}"
        match obs:
            case NodeHeartbeat() | TelemetryReported() | NodeRegistered() if self.said_before_leaving(obs):
                self.notes.append(f"{obs.node_id}: {type(obs).__name__} from before it deregistered")
            case NodeHeartbeat() | TelemetryReported() if self.stale_news_of_unknown(obs):
                self.notes.append(f"{obs.node_id}: an old {type(obs).__name__} of an unknown node says nothing now")
            case NodeHeartbeat():
                n = self.heard_from(self.node(obs.node_id), obs)
                at = self.seen_at(obs.occurred_at)
                last = n.last_beat if n.last_beat is not None and n.last_beat > at else at
                interval = obs.interval_s or n.interval_s
                beaten = msgspec.structs.replace(n, last_beat=last, interval_s=interval)
                if interval != n.interval_s:
                    self.put(beaten)
                else:
                    self.put_times(beaten)
            case NodeRegistered():
                self.departed.discard(obs.node_id)
                self.registered(obs)
            case NodeDeregistered():
                # It left cleanly: not a failure; the pool removes it, so do we.
                self.nodes.discard(obs.node_id)
                self._by_source = None
                self.departed[obs.node_id] = obs.occurred_at
            case TelemetryReported():
                self.telemetry(obs)
            case LinkStateChanged() | LinkDegraded() | LinkFlapping() | LinkRecovered():
                self.link_news(obs)
            case JobExited():
                self.job_exited(obs)
            case JobFinished():
                # It will not be requeued again: its count of hardware hits and what it held are no
                # longer needed, and a hit that comes after this says nothing about it.
                self.jobs.discard(obs.job_id)
                self.finished.discard(obs.job_id)  # to the end of the (oldest first) order
                self.finished[obs.job_id] = self.now
                for key in [k for k, h in self.holdings.items() if h.job_id == obs.job_id]:
                    del self.holdings[key]
            case AllocationGranted() if obs.job_id in self.finished:
                self.notes.append(f"{obs.job_id}: a grant after the job finished is not watched")
            case AllocationGranted():
                gpus = sorted(a.gpu_index for a in obs.assignments if a.node_id == obs.node_id)
                self.holdings[f"{obs.allocation_id}/{obs.node_id}"] = Holding(
                    allocation_id=obs.allocation_id, job_id=obs.job_id, node_id=obs.node_id, gpu_indices=gpus
                )
            case AllocationReleased() | AllocationRevoked() | AllocationExpired():
                self.holdings.discard(f"{obs.allocation_id}/{obs.node_id}")
            case ConnectionClosed():
                self.connection_closed(obs)
            case ConnectionOpened():
                for node_id in self.nodes_of(obs.source):
                    n = self.nodes[node_id]
                    if n.connection_closed_at is not None:
                        self.put(msgspec.structs.replace(n, connection_closed_at=None))

    def heard_from(self, n: NodeHealth, obs: NodeHeartbeat | TelemetryReported | NodeRegistered) -> NodeHealth:
        """The node with its agent's `source`; a word sent after its connection closed clears the close."""
        closed = n.connection_closed_at
        if closed is not None and obs.occurred_at > closed:
            closed = None
        if obs.source == n.source and closed == n.connection_closed_at:
            return n
        if obs.source != n.source:
            self._by_source = None
        return self.put(msgspec.structs.replace(n, source=obs.source, connection_closed_at=closed))

    def nodes_of(self, source: str) -> list[str]:
        """The nodes whose newest word came from `source`, in id order."""
        if self._by_source is None:
            self._by_source = {}
            for node_id in sorted(self.nodes):
                s = self.nodes[node_id].source
                if s:
                    self._by_source.setdefault(s, []).append(node_id)
        return self._by_source.get(source, [])

    def connection_closed(self, closed: ConnectionClosed) -> None:
        """The agent's last bus connection closed: its nodes that have not been heard from since are on notice."""
        at = self.seen_at(closed.at)
        for node_id in self.nodes_of(closed.source):
            n = self.nodes[node_id]
            if n.status == "failed" or n.connection_closed_at is not None:
                continue
            if n.last_beat is not None and n.last_beat > at:
                continue  # it spoke after the close (through a new connection whose opening we have not seen yet)
            self.put(msgspec.structs.replace(n, connection_closed_at=at))

    def said_before_leaving(self, obs: NodeHeartbeat | TelemetryReported | NodeRegistered) -> bool:
        left = self.departed.get(obs.node_id)
        return left is not None and obs.occurred_at <= left

    def stale_news_of_unknown(self, obs: NodeHeartbeat | TelemetryReported) -> bool:
        """A beat older than the fail window from a node not known (any more): a departed node's last word."""
        if obs.node_id in self.nodes:
            return False
        rules = self.cfg.heartbeat
        interval = obs.interval_s if isinstance(obs, NodeHeartbeat) else 0.0
        window = max(rules.fail_after_s, rules.suspect_after_intervals * interval)
        return (self.now - obs.occurred_at).total_seconds() > window

    def registered(self, reg: NodeRegistered) -> None:
        n = self.heard_from(self.node(reg.node_id), reg)
        at = self.seen_at(reg.occurred_at)
        last = n.last_beat if n.last_beat is not None and n.last_beat > at else at
        gpus = dict(n.gpus)
        # A registration follows a restart of the agent or a reboot: GPU verdicts start afresh.
        for index, g in sorted(n.gpus.items()):
            if g.operator_cordon:  # an operator's cordon outlives a restart; the verdict does not
                gpus[index] = GpuHealth(index=index, cordoned=True, operator_cordon=g.operator_cordon)
                continue
            if g.cordoned or g.failed:
                self.emit(Uncordoned(**self.env(n.node_id), node_id=n.node_id, scope="gpu", gpu_index=index))
            gpus.pop(index)
        rebooted = n.needs_reboot and (n.since is None or at >= n.since)
        self.put(
            msgspec.structs.replace(
                n,
                last_beat=last,
                gpus=gpus,
                needs_reboot=n.needs_reboot and not rebooted,
                healthy_since=None,
                gpu_count=len(reg.gpus),
                # Samples are judged once each, in the order of the node's own clock: a registration
                # (a restart, a reboot that may have stepped the clock back) starts that order again.
                telemetry_at=at - dt.timedelta(microseconds=1),
            )
        )

    def telemetry(self, t: TelemetryReported) -> None:
        n = self.heard_from(self.node(t.node_id), t)
        if n.telemetry_at is not None and t.occurred_at <= n.telemetry_at:
            self.notes.append(f"{n.node_id}: telemetry of {t.occurred_at.isoformat()} was judged already")
            return
        at = self.seen_at(t.occurred_at)
        n = self.put_times(
            msgspec.structs.replace(
                n, telemetry_at=at, last_beat=at if n.last_beat is None or at > n.last_beat else n.last_beat
            )
        )
        for sample in t.gpus:
            j = judge_gpu(sample, self.cfg.gpu, self.cfg.xid_overrides)
            g = n.gpus.get(sample.index) or GpuHealth(index=sample.index)
            match j.verdict:
                case "node_reboot":
                    self.fail_node(n.node_id, f"GPU {sample.index}: {j.reason}", needs_reboot=True)
                    n = self.nodes[n.node_id]
                    continue
                case "failed" if not g.failed:
                    self.emit(
                        GpuFailed(
                            **self.env(n.node_id), node_id=n.node_id, gpu_index=g.index, reason=j.reason, xid=j.xid
                        )
                    )
                    if not g.cordoned:
                        self.emit(self.cordoned(n.node_id, "gpu", j.reason, gpu_index=g.index))
                    g = GpuHealth(
                        index=g.index,
                        failed=True,
                        cordoned=True,
                        reason=j.reason,
                        xid=j.xid,
                        operator_cordon=g.operator_cordon,
                    )
                    self.requeue([h for h in self.on_node(n.node_id) if g.index in h.gpu_indices], j.reason)
                case "cordon" if not g.cordoned:
                    self.emit(self.cordoned(n.node_id, "gpu", j.reason, gpu_index=g.index))
                    g = GpuHealth(index=g.index, cordoned=True, reason=j.reason)
                case "cordon" | "failed":
                    if g.fine_since is not None:
                        g = msgspec.structs.replace(g, fine_since=None)
                case "ok" | "application":
                    if j.verdict == "application":
                        self.notes.append(f"{n.node_id} GPU {g.index}: {j.reason} is the application's")
                    if g.cordoned and not g.failed and not g.operator_cordon and j.cool and g.fine_since is None:
                        g = msgspec.structs.replace(g, fine_since=at)
            if g != n.gpus.get(sample.index) and (g.cordoned or g.failed or sample.index in n.gpus):
                n = self.put(msgspec.structs.replace(n, gpus={**n.gpus, g.index: g}))

    def link_news(self, news: LinkStateChanged | LinkDegraded | LinkFlapping | LinkRecovered) -> None:
        problems = set(self.link_problems.get(news.link_id, ()))
        match news:
            case LinkStateChanged(state="down"):
                problems.add("down")
            case LinkStateChanged(state="flapping"):
                problems.add("flapping")
            case LinkStateChanged():  # up or degraded: neither down nor flapping any more
                problems -= {"down", "flapping"}
            case LinkDegraded():
                problems.add(news.problem or "errors")
            case LinkFlapping():
                problems.add("flapping")
            case LinkRecovered():
                problems.discard(news.problem)
        if problems:
            self.link_problems[news.link_id] = sorted(problems)
        else:
            self.link_problems.discard(news.link_id)
        target = self.links.get(news.link_id)
        if target is None:
            self.notes.append(f"link {news.link_id} is not a host cable or leaf uplink of the known topology")
            return
        out = cordoning_problems(problems, self.cfg.cordon_degraded_links)
        reason = f"link {news.link_id} {'/'.join(out)}"
        for node_id in target.node_ids:
            n = self.node(node_id, seen=False)
            if target.kind == "host_rail" and target.rail is not None:
                rail = target.rail
                before = n.rail_cordons.get(rail, [])
                after = sorted(set(before) | {news.link_id}) if out else [x for x in before if x != news.link_id]
                rails = (
                    {**n.rail_cordons, rail: after} if after else {r: v for r, v in n.rail_cordons.items() if r != rail}
                )
                if after and not before:
                    self.emit(self.cordoned(node_id, "rail", reason, rail=rail))
                elif before and not after:
                    self.emit(Uncordoned(**self.env(node_id), node_id=node_id, scope="rail", rail=rail))
                self.put(msgspec.structs.replace(n, rail_cordons=rails))
            elif target.kind == "leaf_uplink":
                before = n.leaf_cordons
                after = sorted(set(before) | {news.link_id}) if out else [x for x in before if x != news.link_id]
                if after and not before:
                    self.emit(self.cordoned(node_id, "leaf", f"{reason} (leaf {target.leaf})"))
                elif before and not after:
                    self.emit(Uncordoned(**self.env(node_id), node_id=node_id, scope="leaf"))
                self.put(msgspec.structs.replace(n, leaf_cordons=after))

    def job_exited(self, e: JobExited) -> None:
        holding = self.holdings.discard(f"{e.allocation_id}/{e.node_id}")
        if blame(e.reason) != "hardware":
            return
        held = [holding] if holding is not None else []
        if not held:
            held = [Holding(allocation_id=e.allocation_id, job_id=e.job_id, node_id=e.node_id, gpu_indices=[])]
        # The job ended by itself: count the hit, but the scheduler learns of the exit from JobExited.
        self.count_hits(held, f"job exited: {e.reason} {e.detail}".strip(), requeue=False)

    # -- actions ---------------------------------------------------------------------------------

    def cordoned(
        self, node_id: str, scope: CordonScope, reason: str, *, gpu_index: int | None = None, rail: int | None = None
    ) -> Cordoned:
        return Cordoned(
            **self.env(node_id), node_id=node_id, scope=scope, reason=reason, gpu_index=gpu_index, rail=rail
        )

    def on_node(self, node_id: str) -> list[Holding]:
        return [h for _, h in sorted(self.holdings.items()) if h.node_id == node_id]

    def requeue(self, held: Sequence[Holding], reason: str) -> None:
        self.count_hits(held, reason, requeue=True)

    def count_hits(self, held: Sequence[Holding], reason: str, *, requeue: bool) -> None:
        rules = self.cfg.retry
        seen: set[str] = set()
        for h in held:
            if h.allocation_id in seen or h.job_id in self.finished:
                continue  # a gang member on another node of the same allocation; a job already over
            seen.add(h.allocation_id)
            job = self.jobs.get(h.job_id) or JobRecord(job_id=h.job_id)
            if h.allocation_id in job.counted:
                continue
            job = JobRecord(
                job_id=job.job_id,
                failures=job.failures + 1,
                flagged=job.flagged,
                node_ids=sorted({*job.node_ids, h.node_id}),
                counted=[*job.counted, h.allocation_id],
            )
            if requeue and may_requeue(job.failures, rules):
                self.emit(
                    RequeueRequested(
                        **self.env(h.job_id),
                        job_id=h.job_id,
                        allocation_id=h.allocation_id,
                        reason=reason,
                        attempt=job.failures,
                        retry_after_s=requeue_backoff_s(job.failures, rules),
                        node_id=h.node_id,
                    )
                )
            if flagged(job.failures, rules) and not job.flagged:
                job = msgspec.structs.replace(job, flagged=True)
                why = f"hit by failing hardware {job.failures} times; last: {reason}"
                if not may_requeue(job.failures + 1, rules):
                    why += f"; no requeue after {rules.max_requeues}"
                self.emit(
                    JobFlagged(
                        **self.env(h.job_id), job_id=h.job_id, failures=job.failures, reason=why, node_ids=job.node_ids
                    )
                )
            self.jobs[h.job_id] = job

    def suspect(self, n: NodeHealth, reason: str) -> NodeHealth:
        self.emit(NodeSuspected(**self.env(n.node_id), node_id=n.node_id, reason=reason))
        return self.put(
            msgspec.structs.replace(
                n, status="suspect", reason=reason, since=self.now, healthy_since=None, suspected_quietly=False
            )
        )

    def fail_node(self, node_id: str, reason: str, *, needs_reboot: bool = False) -> None:
        n = self.node(node_id)
        if n.status == "failed":
            if needs_reboot and not n.needs_reboot:
                self.put(msgspec.structs.replace(n, needs_reboot=True, healthy_since=None))
            return
        cfg = self.cfg
        recent = n.last_failed_at is not None and (self.now - n.last_failed_at).total_seconds() <= cfg.flap_memory_s
        failures = n.failures + 1 if recent else 1
        hold = min(cfg.stable_window_s * 2 ** (failures - 1), cfg.max_hold_s)
        self.emit(NodeFailed(**self.env(node_id), node_id=node_id, reason=reason))
        if not n.cordoned:
            self.emit(self.cordoned(node_id, "node", reason))
        self.emit(DrainRequested(**self.env(node_id), node_id=node_id, reason=reason))
        self.put(
            msgspec.structs.replace(
                n,
                status="failed",
                cut_off=False,
                reason=reason,
                since=self.now,
                healthy_since=None,
                needs_reboot=needs_reboot,
                cordoned=True,
                failures=failures,
                last_failed_at=self.now,
                hold_s=hold,
            )
        )
        self.requeue(self.on_node(node_id), f"node {node_id} failed: {reason}")

    def recover(self, n: NodeHealth) -> None:
        if not (n.status == "suspect" and n.suspected_quietly):  # its suspicion was never sent
            self.emit(NodeRecovered(**self.env(n.node_id), node_id=n.node_id))
        # An operator's drain or cordon outlives the verdict: only an operator lifts it.
        held = bool(n.operator_drain or n.operator_cordon)
        if n.cordoned and not held:
            self.emit(Uncordoned(**self.env(n.node_id), node_id=n.node_id, scope="node"))
        self.put(
            msgspec.structs.replace(
                n,
                status="healthy",
                reason="",
                since=self.now,
                healthy_since=None,
                cordoned=n.cordoned and held,
                cut_off=False,
                suspected_quietly=False,
            )
        )

    # -- the clock -------------------------------------------------------------------------------

    def judge_nodes(self) -> None:
        cfg, now, heard = self.cfg, self.now, self.heard
        for node_id, left in list(self.departed.items()):
            if (now - left).total_seconds() > cfg.flap_memory_s:
                del self.departed[node_id]
        # Oldest first (insertion order): stop at the first one still remembered.
        while self.finished:
            job_id, ended = next(iter(self.finished.items()))
            if len(self.finished) <= FINISHED_KEPT and (now - ended).total_seconds() <= cfg.finished_memory_s:
                break
            del self.finished[job_id]
        # Nodes to fail (each with why, and whether by its closed connection), and the nodes whose
        # connection closed within the grace.
        lost: list[tuple[NodeHealth, str, bool]] = []
        closing: list[str] = []
        # The common case at scale, a healthy node that beat on time with no GPU cordon to lift and
        # its connection open, is decided by one comparison against its interval's latest on-time
        # beat (computed once per interval): nothing else in the loop can change such a node.
        on_time_after: dict[float, dt.datetime] = {}
        # The NodeSuspected this decision sent by the heartbeat rule: its position among the events -> node.
        suspicions: dict[int, str] = {}
        self.cause = "clock/heartbeat"
        # With a watch, only the nodes it says may not be such a node (the loop's result is the same).
        self.watch_nodes()
        judged = sorted(self.nodes) if self.watch is None else self.watch.to_judge(self.nodes, heard)
        for node_id in judged:
            n = self.nodes[node_id]
            last_beat = n.last_beat
            if last_beat is None:
                continue
            if n.status == "healthy" and not n.gpus and n.connection_closed_at is None:
                cutoff = on_time_after.get(n.interval_s)
                if cutoff is None:
                    late_after = cfg.heartbeat.suspect_after_intervals * n.interval_s
                    cutoff = on_time_after[n.interval_s] = heard - dt.timedelta(seconds=late_after)
                if last_beat >= cutoff:
                    continue
            n = self.lift_gpu_cordons(n)
            live = liveness(last_beat, n.interval_s, heard, cfg.heartbeat)
            gap = (heard - last_beat).total_seconds()
            why = f"no heartbeat for {gap:.1f}s"
            closed = n.connection_closed_at
            cut_off = False
            if closed is not None and n.status != "failed":
                # nats-server saw the agent's last connection close and no new one open: lost after
                # the grace for a reconnect, whatever the heartbeats (not read yet, or not due yet) say.
                gone = (now - closed).total_seconds()
                if gone >= cfg.heartbeat.reconnect_grace_s:
                    live, why, cut_off = "lost", f"bus connection closed {gone:.1f}s ago and not reopened", True
                else:
                    closing.append(node_id)
            if live != "alive" and n.status == "healthy":
                n = self.suspect(n, why if cut_off else f"{why} (interval {n.interval_s:g}s)")
                if not cut_off:
                    suspicions[len(self.events) - 1] = node_id
            if cut_off and n.status == "suspect" and not n.cut_off:
                n = self.put(msgspec.structs.replace(n, cut_off=True))
            if live == "lost" and n.status == "suspect":
                lost.append((n, why, cut_off))
                continue
            if n.status == "healthy" or n.needs_reboot:
                continue
            if live != "alive" or closed is not None:
                if n.healthy_since is not None:
                    self.put(msgspec.structs.replace(n, healthy_since=None))
                continue
            since = n.healthy_since or last_beat
            if n.healthy_since is None:
                n = self.put(msgspec.structs.replace(n, healthy_since=since))
            window = clear_after_s(n.interval_s, cfg.heartbeat) if n.status == "suspect" else n.hold_s
            if (now - since).total_seconds() >= window:
                self.recover(n)
        self.watch_nodes()
        self.guard_split_brain(lost, closing, suspicions)
        self.watch_nodes()

    def lift_gpu_cordons(self, n: NodeHealth) -> NodeHealth:
        gpus = dict(n.gpus)
        for index, g in sorted(n.gpus.items()):
            if g.cordoned and not g.failed and not g.operator_cordon and g.fine_since is not None:
                if (self.now - g.fine_since).total_seconds() >= self.cfg.stable_window_s:
                    self.emit(Uncordoned(**self.env(n.node_id), node_id=n.node_id, scope="gpu", gpu_index=index))
                    del gpus[index]
        return n if gpus == n.gpus else self.put(msgspec.structs.replace(n, gpus=gpus))

    def pool_size(self) -> int:
        return pool_size(self.nodes.values()) if self.watch is None else len(self.watch.pool)

    def max_failed(self) -> int:
        return failed_allowed(self.pool_size(), self.cfg)

    def flagged(self) -> list[NodeHealth]:
        """Every node that is not healthy, among others (with a watch: its nodes needing attention)."""
        if self.watch is None:
            return list(self.nodes.values())
        return [self.nodes[i] for i in self.watch.attention if i in self.nodes]

    def guard_split_brain(
        self, lost: list[tuple[NodeHealth, str, bool]], closing: list[str], suspicions: Mapping[int, str]
    ) -> None:
        flagged = self.flagged()
        failed = sum(1 for n in flagged if n.status == "failed")
        limit = self.max_failed()
        # Every node late right now counts, the lost among them, and every node whose connection
        # closed within the grace: when more of the cluster is late at once than may fail, the cause
        # is more likely shared (the bus, a NATS server that dropped its clients, this controller, a
        # slow or overloaded pipeline), also when the nodes cross the fail window one by one. The
        # guard holds until that many are no longer late.
        late = sorted({n.node_id for n in flagged if n.status == "suspect"}.union(closing))
        by_connection = [(n, why) for n, why, cut_off in lost if cut_off]
        by_beats = [(n, why) for n, why, cut_off in lost if not cut_off]
        # A closed connection is the server's word on that one agent: heartbeats late for a shared
        # reason do not hold it back, only many connections closing at once (a server that dropped
        # its clients, a partition) do.
        cut_off_now = set(closing).union(
            (n.node_id for n, _ in by_connection),
            (n.node_id for n in flagged if n.status == "suspect" and n.cut_off),
        )
        connections_over = failed + len(cut_off_now) > limit
        beats_over = failed + max(len(late), len(by_beats)) > limit
        held = [*(by_connection if connections_over else []), *(by_beats if beats_over else [])]
        if beats_over and suspicions:
            # More of the cluster late at once than may fail: one ClusterDegraded says it for all of
            # them, not a NodeSuspected each (a stalled bus or publisher would send thousands).
            self.events = [e for i, e in enumerate(self.events) if i not in suspicions]
            for node_id in suspicions.values():
                self.put(msgspec.structs.replace(self.nodes[node_id], suspected_quietly=True))
        self.cause = "clock/lost"
        for n, why in [*(by_connection if not connections_over else []), *(by_beats if not beats_over else [])]:
            self.fail_node(n.node_id, why)
        self.cause = "clock/cluster"
        if connections_over or beats_over:
            if (held or (beats_over and suspicions)) and not self.degraded:
                self.degraded = True
                self.emit(
                    ClusterDegraded(
                        **self.env(self.cfg.cluster),
                        unreachable=len(late),
                        failed=failed,
                        nodes=self.pool_size(),
                        max_failed=limit,
                        node_ids=late,
                    )
                )
            return
        if self.degraded:
            self.degraded = False
            nodes = self.pool_size()
            self.emit(ClusterRestored(**self.env(self.cfg.cluster), unreachable=len(lost), nodes=nodes))
