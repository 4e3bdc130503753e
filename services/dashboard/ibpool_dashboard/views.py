"""The dashboard's page models: the services' API answers (decoded JSON) in, what a page draws out.

Pure: no I/O, no clock (times are passed in). Each function takes the answers as the services give
them (`/v1/pool`, `/v1/allocations`, `/health/nodes`, `/v1/jobs`, `/v1/topology`, `/v1/links`, ...)
and the newest GPU telemetry per node from the bus; a service that did not answer is passed as
None (or empty) and its part of the page is left empty rather than guessed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ibpool_core.fabric.graph import Graph
from ibpool_core.fabric.model import Topology

Json = dict[str, Any]

# Jobs that hold or wait for GPUs (what the queue and the overview count), and the waiting ones.
WAITING = ("queued", "proposed")
# Link states from best to worst: an edge drawn for several parallel cables shows the worst.
LINK_ORDER = ("up", "degraded", "flapping", "down")
# A GPU's state on the grid: busy (whole GPU granted), shared (part of it), idle, or the pool's own
# state when that is not `ready` (cordoned, failed, draining...).
GPU_STATES = ("busy", "shared", "idle")


class GpuSlice(msgspec.Struct, frozen=True, kw_only=True):
    job: str
    milli: int
    mig: str | None = None


class GpuCell(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    model: str
    state: str
    granted_milli: int
    slices: list[GpuSlice]
    utilization_pct: float | None = None
    temperature_c: float | None = None
    memory_used_mib: int | None = None
    memory_mib: int = 0


class GpuNode(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    state: str
    health: str
    gpus: list[GpuCell]


class GpuGrid(msgspec.Struct, frozen=True, kw_only=True):
    nodes: list[GpuNode]


class HistoryPoint(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    at: float
    allocated_pct: float
    queued: int
    running: int


class Overview(msgspec.Struct, frozen=True, kw_only=True):
    gpus: int
    gpus_by_state: dict[str, int]
    allocated_pct: float
    mean_utilization_pct: float | None
    nodes_by_health: dict[str, int]
    jobs_by_state: dict[str, int]
    queued: int
    running: int
    links_with_problems: int
    fabric: str
    history: list[HistoryPoint]


class QueuedJob(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    tenant: str
    queue: str
    state: str
    priority: int
    shape: str
    waited_s: float | None
    reason: str
    wait_code: str | None


class QueueView(msgspec.Struct, frozen=True, kw_only=True):
    queues: list[Json]
    jobs: list[QueuedJob]
    running: list[QueuedJob]


class FabricSwitch(msgspec.Struct, frozen=True, kw_only=True):
    guid: str
    name: str
    tier: int
    sharp: bool


class FabricEdge(msgspec.Struct, frozen=True, kw_only=True):
    a: str  # a switch GUID or a host name
    b: str
    cables: int
    state: str
    problems: list[str]
    highlighted: bool = False


class FabricView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    tiers: int
    switches: list[FabricSwitch]
    hosts: list[str]
    edges: list[FabricEdge]
    highlighted_hosts: list[str]
    # The leaves the highlighted hosts are cabled to.
    highlighted_switches: list[str] = []
    job: str | None = None


class NodeRow(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    pool_state: str
    health: str
    reason: str
    cordoned: bool
    drained: str
    gpus: int
    free_gpus: float
    jobs: list[str]
    last_beat: str | None
    history: list[Json]


class NodesView(msgspec.Struct, frozen=True, kw_only=True):
    nodes: list[NodeRow]


class JobDetail(msgspec.Struct, frozen=True, kw_only=True):
    job: Json
    shape: str
    ranks: list[str]
    sharp: bool | None
    sharp_reason: str
    tier: int | None
    assignments: list[Json]
    events: list[EventRow]
    trace_id: str | None


def shape(job: Mapping[str, Any]) -> str:
    """A job's GPUs in one word: `0.25 GPU`, `4`, `2x8`."""
    milli = int(job.get("milli", 1000))
    if milli < 1000:
        return f"{milli / 1000:g} GPU"
    hosts = int(job.get("hosts", 1))
    return f"{hosts}x{job.get('gpus_per_host', 0)}" if hosts > 1 else str(job.get("gpus", 0))


def owners(allocations: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Allocation id -> the job (owner) holding it."""
    return {a["allocation_id"]: a["owner"] for a in allocations}


def gpu_state(gpu: Mapping[str, Any]) -> str:
    """One of GPU_STATES for a ready GPU, else the pool's state of it."""
    if gpu.get("state", "ready") != "ready":
        return str(gpu["state"])
    granted = int(gpu.get("granted_milli", 0))
    return "busy" if granted >= 1000 else "shared" if granted > 0 else "idle"


def gpu_grid(
    pool: Mapping[str, Any] | None,
    allocations: Sequence[Mapping[str, Any]],
    health: Sequence[Mapping[str, Any]],
    telemetry: Mapping[str, Mapping[str, Any]],
) -> GpuGrid:
    """Every GPU of the pool by node: its state, the jobs holding it (whole, a fraction or a MIG
    slice each) and its newest telemetry sample (`telemetry`: node -> TelemetryReported as JSON)."""
    slices: dict[tuple[str, int], list[GpuSlice]] = {}
    for a in allocations:
        for g in a.get("grants", []):
            mig = g.get("mig")
            profile = mig.get("profile") if isinstance(mig, dict) else mig
            slices.setdefault((g["node_id"], g["gpu_index"]), []).append(
                GpuSlice(job=a["owner"], milli=int(g["milli"]), mig=str(profile) if profile else None)
            )
    health_of = {h["node_id"]: h for h in health}
    nodes = []
    for n in (pool or {}).get("nodes", []):
        samples = {s["index"]: s for s in telemetry.get(n["node_id"], {}).get("gpus", [])}
        failed = {g["index"]: g for g in health_of.get(n["node_id"], {}).get("gpus", [])}
        cells = []
        for g in n["gpus"]:
            s = samples.get(g["index"], {})
            state = gpu_state(g)
            bad = failed.get(g["index"])
            if bad is not None and state in GPU_STATES:
                state = "failed" if bad.get("failed") else "cordoned" if bad.get("cordoned") else state
            cells.append(
                GpuCell(
                    index=g["index"],
                    model=g["model"],
                    state=state,
                    granted_milli=int(g.get("granted_milli", 0)),
                    slices=sorted(slices.get((n["node_id"], g["index"]), []), key=lambda x: x.job),
                    utilization_pct=s.get("utilization_pct"),
                    temperature_c=s.get("temperature_c"),
                    memory_used_mib=s.get("memory_used_mib"),
                    memory_mib=int(g.get("memory_mib", 0)),
                )
            )
        h = health_of.get(n["node_id"], {})
        nodes.append(GpuNode(node_id=n["node_id"], state=n["state"], health=h.get("status", "unknown"), gpus=cells))
    return GpuGrid(nodes=sorted(nodes, key=lambda x: x.node_id))


def count_jobs(jobs: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in jobs:
        out[j["state"]] = out.get(j["state"], 0) + 1
    return dict(sorted(out.items()))


def history_point(pool: Mapping[str, Any] | None, jobs: Sequence[Mapping[str, Any]], at: float) -> HistoryPoint:
    """One point of the overview's charts: GPU share allocated, jobs waiting and running, at `at`."""
    by_state = count_jobs(jobs)
    return HistoryPoint(
        at=at,
        allocated_pct=allocated_pct(pool),
        queued=sum(by_state.get(s, 0) for s in WAITING),
        running=by_state.get("running", 0) + by_state.get("scheduled", 0),
    )


def allocated_pct(pool: Mapping[str, Any] | None) -> float:
    models = (pool or {}).get("models", [])
    capacity = sum(m["capacity_milli"] for m in models)
    return round(100.0 * sum(m["allocated_milli"] for m in models) / capacity, 1) if capacity else 0.0


def overview(
    pool: Mapping[str, Any] | None,
    health: Sequence[Mapping[str, Any]],
    jobs: Sequence[Mapping[str, Any]],
    links: Sequence[Mapping[str, Any]],
    telemetry: Mapping[str, Mapping[str, Any]],
    history: Sequence[HistoryPoint],
) -> Overview:
    """The cluster in numbers: GPUs by state, allocation and utilisation, nodes by health, jobs by
    state, links with problems, and the history of allocation and queue depth."""
    by_state: dict[str, int] = {}
    gpus = 0
    for n in (pool or {}).get("nodes", []):
        for g in n["gpus"]:
            gpus += 1
            s = gpu_state(g)
            by_state[s] = by_state.get(s, 0) + 1
    utils = [s["utilization_pct"] for t in telemetry.values() for s in t.get("gpus", [])]
    nodes_by_health: dict[str, int] = {}
    for h in health:
        nodes_by_health[h["status"]] = nodes_by_health.get(h["status"], 0) + 1
    point = history_point(pool, jobs, 0.0)
    return Overview(
        gpus=gpus,
        gpus_by_state=dict(sorted(by_state.items())),
        allocated_pct=point.allocated_pct,
        mean_utilization_pct=round(sum(utils) / len(utils), 1) if utils else None,
        nodes_by_health=dict(sorted(nodes_by_health.items())),
        jobs_by_state=count_jobs(jobs),
        queued=point.queued,
        running=point.running,
        links_with_problems=sum(1 for ln in links if ln.get("state", "up") != "up"),
        fabric=str(((pool or {}).get("fabric") or {}).get("name", "")),
        history=list(history),
    )


def _since(stamp: str | None, now: dt.datetime) -> float | None:
    if not stamp:
        return None
    return round((now - dt.datetime.fromisoformat(stamp)).total_seconds(), 1)


def _queued_job(j: Mapping[str, Any], now: dt.datetime) -> QueuedJob:
    return QueuedJob(
        job_id=j["job_id"],
        tenant=j["tenant"],
        queue=j["queue"],
        state=j["state"],
        priority=int(j.get("priority", 0)),
        shape=shape(j),
        waited_s=_since(j.get("submitted_at"), now),
        reason=j.get("reason") or "",
        wait_code=j.get("wait_code"),
    )


def queue(jobs: Sequence[Mapping[str, Any]], queues: Mapping[str, Any] | None, now: dt.datetime) -> QueueView:
    """The waiting jobs (highest priority, then longest waiting first) with why each waits, the
    running ones, and each queue's summary as the scheduler gives it."""
    waiting = [_queued_job(j, now) for j in jobs if j["state"] in WAITING]
    waiting.sort(key=lambda q: (-q.priority, -(q.waited_s or 0.0), q.job_id))
    running = [_queued_job(j, now) for j in jobs if j["state"] in ("scheduled", "running")]
    running.sort(key=lambda q: q.job_id)
    return QueueView(queues=list((queues or {}).get("queues", [])), jobs=waiting, running=running)


def _worst(states: Sequence[str]) -> str:
    return max(states, key=lambda s: LINK_ORDER.index(s) if s in LINK_ORDER else len(LINK_ORDER))


def fabric(
    topology: Mapping[str, Any] | None,
    links: Sequence[Mapping[str, Any]],
    highlight: Sequence[str] = (),
    job: str | None = None,
) -> FabricView:
    """The fabric as tiers of switches above the hosts; parallel cables between two devices drawn as
    one edge in the worst health of them (the fabric monitor's link state where it has one, else the
    topology's); the hosts in `highlight` (a job's placement) and their edges highlighted."""
    if not topology:
        return FabricView(name="", tiers=0, switches=[], hosts=[], edges=[], highlighted_hosts=[], job=job)
    topo = msgspec.convert(topology, Topology)
    tiers = Graph(topo).tiers()
    health = {ln["link_id"]: ln for ln in links}
    host_of = {c.guid: c.host for c in topo.cas}
    switches = {s.guid for s in topo.switches}
    lit = set(highlight)
    grouped: dict[tuple[str, str], list[tuple[str, list[str]]]] = {}
    for link in topo.links:
        ends = []
        for guid in (link.a.guid, link.b.guid):
            if guid in switches:
                ends.append(guid)
            elif guid in host_of:
                ends.append(host_of[guid])
        if len(ends) != 2 or ends[0] == ends[1]:
            continue  # a router, or a cable inside one device: not drawn
        h = health.get(link.link_id, {})
        state = str(h.get("state", link.state))
        a, b = sorted(ends)
        grouped.setdefault((a, b), []).append((state, list(h.get("problems", []))))
    lit_switches = {s for (a, b) in grouped for s, other in ((a, b), (b, a)) if other in lit and s in switches}
    edges = [
        FabricEdge(
            a=a,
            b=b,
            cables=len(items),
            state=_worst([s for s, _ in items]),
            problems=sorted({p for _, ps in items for p in ps}),
            highlighted=bool({a, b} & lit),
        )
        for (a, b), items in sorted(grouped.items())
    ]
    return FabricView(
        name=topo.name,
        tiers=max(tiers.values(), default=0),
        switches=[
            FabricSwitch(guid=s.guid, name=s.name, tier=tiers.get(s.guid, 0), sharp=s.sharp)
            for s in sorted(topo.switches, key=lambda s: (tiers.get(s.guid, 0), s.name))
        ],
        hosts=sorted(h.name for h in topo.hosts),
        edges=edges,
        highlighted_hosts=sorted(lit & {h.name for h in topo.hosts}),
        highlighted_switches=sorted(lit_switches),
        job=job,
    )


def nodes(
    pool: Mapping[str, Any] | None,
    health: Sequence[Mapping[str, Any]],
    allocations: Sequence[Mapping[str, Any]],
    verdicts: Sequence[Mapping[str, Any]],
) -> NodesView:
    """Every node: pool state, health verdict, cordon and drain, GPUs free of all, the jobs on it,
    and its verdict history (newest first, as the failover controller keeps it)."""
    held_by = owners(allocations)
    health_of = {h["node_id"]: h for h in health}
    history: dict[str, list[Json]] = {}
    for v in verdicts:
        history.setdefault(v["key"], []).append(
            {"at": v["occurred_at"], "type": v["type"], "reason": (v.get("event") or {}).get("reason", "")}
        )
    names = sorted({n["node_id"] for n in (pool or {}).get("nodes", [])} | set(health_of))
    pool_of = {n["node_id"]: n for n in (pool or {}).get("nodes", [])}
    rows = []
    for name in names:
        n = pool_of.get(name, {})
        h = health_of.get(name, {})
        gpus = n.get("gpus", [])
        rows.append(
            NodeRow(
                node_id=name,
                pool_state=n.get("state", "unknown"),
                health=h.get("status", "unknown"),
                reason=h.get("reason", ""),
                cordoned=bool(h.get("cordoned")),
                drained=h.get("operator_drain", ""),
                gpus=len(gpus),
                free_gpus=n.get("free_milli", 0) / 1000,
                jobs=sorted({held_by.get(x, x) for g in gpus for x in g["holders"]}),
                last_beat=h.get("last_beat"),
                history=history.get(name, []),
            )
        )
    return NodesView(nodes=rows)


def trace_id(traceparent: str | None) -> str | None:
    """The trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`); None if malformed."""
    parts = (traceparent or "").split("-")
    if len(parts) != 4 or len(parts[1]) != 32:
        return None
    return parts[1]


def job_detail(job: Mapping[str, Any], events: Sequence[EventRow]) -> JobDetail:
    """One job: its fields, placement (ranks in order, SHARP and why, the fabric tier it spans, the
    GPUs assigned), its events on the bus (oldest first) and the trace id they carry."""
    placement = job.get("placement") or {}
    traced = next((t for e in events if (t := trace_id(e.traceparent)) is not None), None)
    return JobDetail(
        job=dict(job),
        shape=shape(job),
        ranks=list(placement.get("ranks") or job.get("nodes") or []),
        sharp=placement.get("sharp"),
        sharp_reason=placement.get("sharp_reason", ""),
        tier=placement.get("tier"),
        assignments=list(job.get("assignments") or []),
        events=list(events),
        trace_id=traced,
    )


class EventRow(msgspec.Struct, frozen=True, kw_only=True):
    """An event as the event stream and a job's page list it."""

    seq: int
    at: str | None
    type: str
    key: str
    subject: str
    source: str
    fields: Json
    traceparent: str | None = None


def event_row(
    seq: int, name: str, key: str, subject: str, message: Mapping[str, Any], traceparent: str | None = None
) -> EventRow:
    """`message` (an event as JSON) as a row: its type's name, key and subject, and its own fields."""
    skip = ("id", "key", "source", "occurred_at", "type", "schema_version")
    return EventRow(
        seq=seq,
        at=message.get("occurred_at"),
        type=name,
        key=key,
        subject=subject,
        source=str(message.get("source", "")),
        fields={k: v for k, v in message.items() if k not in skip},
        traceparent=traceparent,
    )
