"""Cells, simulated: the cluster cut into k cells of whole leaf groups, each scheduled on its own, a
router (`ibpool_core.sched.cells.route`) sending each arriving job to one (docs/scale.md, "Past one
control plane").

Every cell is scheduled as the single pool's simulation (`cluster_sim.simulate`) schedules, on its
own hosts: the same `SimConfig` (policy, backfill, scan depth, cost model, placement), its own
queue, runtime predictor, policy state (a learned policy learns from its own jobs) and placer, and
the same `ibpool_core.sched.plan.plan()` per cycle. It is the same loop: each cell is a
`cluster_sim.SimLoop` (the one `simulate()` runs over the whole trace), stepped here for all cells
together, with arrivals pushed as the router sends them; `_CellLoop` adds only the spanning gangs'
hooks. `simulate_cells(..., cells=1)` gives `simulate()`'s outcomes exactly, to the last bit
(tests/test_cells_sim.py, and bench_cells.py on every run). Host failures are not injected here.

The cells: the leaf groups (a fabric's leaf groups, or `hosts_per_leaf` hosts each on the abstract
cluster) in index order, cut into k runs of whole groups, as equal as the group count allows. On a
fabric each cell is the fabric less the other cells' hosts and the leaf switches left without a
host (spines stay), so its placement and cost model are its own.

Routing: at a job's arrival the router sees every cell after the events of that instant that come
before arrivals (ends), with the jobs routed earlier in the same instant queued. It scores with a
placer of its own per cell (the cell's kind, on the same hosts), so routing never changes a
cell's state. A job goes to the cell where it fits now with the best placement score, else the
cell where it is estimated to start first.

Gangs larger than any cell span cells (reservation, modelled simply): the router splits the gang
into parts (`RouteReply.parts`), and each part enters its cell's queue as an ordinary gang of its
hosts, ordered by the job's submit time, under the cell's own policy. A part that starts holds its
hosts idle until every part has started (the commit), then all parts run the job's runtime,
stretched by the cost model for the whole gang's placement (on a fabric, the full fabric's ring
bandwidth over the ranks of every part; no SHARP, each cell's trees being its own), and end
together. A part preempted before the commit goes back to its queue alone; after it, the gang
stops: every part goes back to its queue, the gang keeps the progress it made (checkpointed). One
spanning gang is in flight at a time (submitted, not yet ended), the next waits at the router:
that rules out two gangs each holding a part the other waits for. Counted: the jobs that spanned,
the GPU-seconds parts held idle waiting for their siblings. Not modelled: the reservation's
messages (two commits, two round trips per cell: milliseconds against queueing in minutes), lease
expiry (a part holds until its siblings start), and routing from stale summaries (the router sees
every cell's state as of the arrival).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence

import msgspec

from ibpool_core.fabric.model import Topology, build_topology
from ibpool_core.sched.cells import Cell, RouteRequest, route
from ibpool_core.sched.jobs import FreeCapacity
from ibpool_core.sched.placer import LeafPlacer, Placer, min_leaf_span
from ibpool_core.sched.queueing import QueuePolicy

from .cluster_sim import (
    JobOutcome,
    SimConfig,
    SimFabric,
    SimLoop,
    SimResult,
    framework_placer,
    gang_nodes,
    host_name,
    load_fabric,
    make_sim_policy,
)
from .traces import TraceJob

PART = "@"  # a spanning gang's part in a cell: "<job id>@<cell>"


class CellSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One cell: its name and its hosts (names, in the cell's host order)."""

    name: str
    hosts: list[str]


class GangSpan(msgspec.Struct, frozen=True, kw_only=True):
    """A job that spanned cells: its parts, when it was routed, committed (every part holding its
    hosts) and ended, and the GPU-seconds its parts held idle before the commit."""

    id: str
    gpus: int
    hosts: int
    parts: dict[str, int]  # cell -> hosts
    submit_s: float
    sent_s: float  # when the router submitted the parts (after the spanning gang before it)
    commit_s: float
    end_s: float
    idle_gpu_s: float


class CellsResult(msgspec.Struct, frozen=True, kw_only=True):
    """The run: every job's outcome (a spanning gang once, first start = its commit), the cells'
    own results, the router's decision per job (decision name -> count) and the jobs that were not
    sent to a cell where they fit at arrival."""

    cells: int
    whole: SimResult
    per_cell: list[SimResult]
    cell_of: dict[str, str]  # job id -> cell (spanning jobs: "span")
    decisions: dict[str, int]
    routed_waiting: int  # routed "waits": no cell had room at arrival
    fragmented: int  # of those, jobs the cells' free hosts together held at arrival
    spans: list[GangSpan]
    router_cpu_s: float


def leaf_groups(config: SimConfig) -> tuple[list[str], list[list[str]], Topology | None]:
    """The cluster's host names and its leaf groups (host names, in group order), and the fabric."""
    if config.fabric is None:
        names = [host_name(h) for h in range(config.nodes)]
        hpl = config.hosts_per_leaf
        return names, [names[i : i + hpl] for i in range(0, len(names), hpl)], None
    topology = load_fabric(config.fabric)
    real = SimFabric(topology, config)
    groups: dict[int, list[str]] = {}
    for name, group in zip(real.names, real.leaf_of, strict=True):
        groups.setdefault(group, []).append(name)
    return real.names, [groups[g] for g in sorted(groups)], topology


def split_cells(groups: Sequence[Sequence[str]], k: int) -> list[CellSpec]:
    """`k` cells of whole leaf groups, in group order, as equal in group count as can be (the first
    cells take one group more); ValueError if there are fewer groups than cells."""
    if k < 1 or k > len(groups):
        raise ValueError(f"{k} cells of whole leaf groups need 1..{len(groups)} cells ({len(groups)} groups)")
    base, extra = divmod(len(groups), k)
    cells, at = [], 0
    for c in range(k):
        n = base + (1 if c < extra else 0)
        cells.append(CellSpec(name=f"cell{c}", hosts=[h for g in groups[at : at + n] for h in g]))
        at += n
    return cells


def sub_topology(topology: Topology, hosts: Sequence[str]) -> Topology:
    """`topology` with only `hosts`: their adapters and cables, every switch above them (a switch
    cabled to no adapter), and the switches cabled to their adapters; other leaf switches dropped."""
    keep = set(hosts)
    cas = [c for c in topology.cas if c.host in keep]
    ca_guids = {c.guid for c in cas}
    all_ca = {c.guid for c in topology.cas}
    leafs_any: set[str] = set()
    leafs_kept: set[str] = set()
    for link in topology.links:
        for end, other in ((link.a, link.b), (link.b, link.a)):
            if other.guid in all_ca:
                leafs_any.add(end.guid)
                if other.guid in ca_guids:
                    leafs_kept.add(end.guid)
    switches = [s for s in topology.switches if s.guid not in leafs_any or s.guid in leafs_kept]
    alive = {s.guid for s in switches} | ca_guids | {r.guid for r in topology.routers}
    links = [lk for lk in topology.links if lk.a.guid in alive and lk.b.guid in alive]
    return build_topology(
        name=f"{topology.name} ({len(keep)} hosts)",
        hosts=[h for h in topology.hosts if h.name in keep],
        cas=cas,
        switches=switches,
        routers=list(topology.routers),
        links=links,
    )


class _Gang(msgspec.Struct, kw_only=True):
    trace: TraceJob
    parts: dict[str, int]  # cell -> hosts
    gpus: dict[str, int]  # cell -> GPUs
    remaining_s: float
    sent_s: float = math.nan
    held_since: dict[str, float] = {}  # cell -> when its part started holding (this run)
    committed_s: float | None = None
    first_commit_s: float | None = None
    stretch: float = 1.0
    restarts: int = 0
    preemptions: int = 0
    idle_gpu_s: float = 0.0
    ends: dict[str, float] = {}
    leaves: int = 0
    min_leaves: int = 1


class _CellLoop(SimLoop):
    """One cell's `SimLoop`, with the hooks of the spanning gangs: a gang's part that starts holds its
    hosts until the driver commits the gang, a part that stops or ends tells the driver, a part's
    runtime trains nothing, and the fair-share refresh goes on while the router has jobs to send."""

    def __init__(
        self,
        name: str,
        config: SimConfig,
        real: SimFabric | None,
        policy: QueuePolicy,
        tenants: list[str],
        first_submit: float | None,
        driver: _Driver,
    ) -> None:
        super().__init__(config, policy, fabric=real, tenants=tenants, first_submit=first_submit)
        self.name = name
        self.driver = driver

    def on_start(self, job_id: str, now: float, restore_s: float, runtime_s: float) -> None:
        if PART in job_id:
            self.driver.part_started(job_id, self, now)
        else:
            self.run_until_end(job_id, now, restore_s, runtime_s)

    def on_requeue(self, job_id: str, now: float) -> None:
        if PART in job_id:
            self.driver.part_stopped(job_id, self, now)

    def on_end(self, job_id: str, now: float) -> None:
        if PART in job_id:
            self.driver.part_ended(job_id, self, now)

    def learns_from(self, job_id: str) -> bool:
        return PART not in job_id

    def more_to_come(self) -> bool:
        return self.driver.arrivals_left()

    def router_view(self, placer: Placer) -> Cell:
        order = self.first_order
        return Cell(
            name=self.name,
            cluster=FreeCapacity(free=list(self.free), capacity=self.cluster.capacity, leaf_of=self.cluster.leaf_of),
            running=self.running_list,
            queue=self.queues.jobs[order],
            hosts_per_leaf=self.config.hosts_per_leaf,
            placer=placer,
        )


class _Driver:
    """The cells, the router and the spanning gangs, stepped together."""

    def __init__(self, trace: Sequence[TraceJob], config: SimConfig, k: int) -> None:
        if config.failures:
            raise ValueError("the cells simulation does not inject host failures")
        names, groups, topology = leaf_groups(config)
        self.specs = split_cells(groups, k)
        self.config = config
        self.full: SimFabric | None = SimFabric(topology, config) if topology is not None else None
        self.gpn = config.gpus_per_node
        too_big = [t.id for t in trace if gang_nodes(t.gpus, self.gpn) > len(names)]
        if too_big:
            raise ValueError(f"{len(too_big)} jobs need more hosts than the cluster has, e.g. {too_big[0]}")
        self.arrivals = sorted(range(len(trace)), key=lambda i: (trace[i].submit_s, i))
        self.trace = trace
        self.next = 0
        tenants = sorted({t.tenant for t in trace})
        first = trace[0].submit_s if trace else None
        self.cells: list[_CellLoop] = []
        self.router_placers: list[Placer] = []
        for spec in self.specs:
            policy = make_sim_policy(config, trace)
            if topology is not None:
                sub = topology if k == 1 else sub_topology(topology, spec.hosts)
                real: SimFabric | None = SimFabric(sub, config)
                self.router_placers.append(SimFabric(sub, config).placer)
                cell_config = config
            else:
                real = None
                cell_config = msgspec.structs.replace(config, nodes=len(spec.hosts))
                self.router_placers.append(
                    framework_placer(cell_config) if config.placement == "framework" else LeafPlacer()
                )
            self.cells.append(_CellLoop(spec.name, cell_config, real, policy, tenants, first, self))
        self.by_name = {c.name: c for c in self.cells}
        self.cell_of: dict[str, str] = {}
        self.decisions: dict[str, int] = {}
        self.routed_waiting = 0
        self.fragmented = 0
        self.gangs: dict[str, _Gang] = {}
        self.span_queue: deque[str] = deque()
        self.in_flight: str | None = None
        self.spans: list[GangSpan] = []
        self.router_cpu_s = 0.0
        self.stopping = False

    def arrivals_left(self) -> bool:
        """Whether a job is still to come to some cell: an arrival, or a spanning gang not yet sent."""
        return self.next < len(self.arrivals) or bool(self.span_queue)

    # -- routing ---------------------------------------------------------------------------------

    def route(self, t: TraceJob, now: float) -> None:
        started = time.process_time()
        cells = [c.router_view(p) for c, p in zip(self.cells, self.router_placers, strict=True)]
        job = self.cells[0].job_of(t)
        reply = route(RouteRequest(now=now, job=job, cells=cells, safety_margin=self.config.cycle.safety_margin))
        self.router_cpu_s += time.process_time() - started
        self.decisions[reply.decision] = self.decisions.get(reply.decision, 0) + 1
        if reply.decision == "waits":
            self.routed_waiting += 1
            self.fragmented += reply.fits_union_now
        if reply.decision in ("fits", "waits"):
            assert reply.cell is not None
            self.cell_of[t.id] = reply.cell
            self.by_name[reply.cell].arrive(t, now)
            return
        if reply.decision == "infeasible":  # ruled out above: no job is larger than the cluster
            raise ValueError(f"job {t.id}: {reply.reason}")
        self.cell_of[t.id] = "span"
        self.gangs[t.id] = _Gang(
            trace=t,
            parts={p.cell: p.hosts for p in reply.parts},
            gpus={p.cell: p.gpus for p in reply.parts},
            remaining_s=t.duration_s,
        )
        self.span_queue.append(t.id)
        self.send_next_gang(now)

    def send_next_gang(self, now: float) -> None:
        if self.in_flight is not None or not self.span_queue:
            return
        gang_id = self.span_queue.popleft()
        gang = self.gangs[gang_id]
        self.in_flight = gang_id
        gang.sent_s = now
        for cell, hosts in gang.parts.items():
            part = msgspec.structs.replace(gang.trace, id=f"{gang_id}{PART}{cell}", gpus=gang.gpus[cell])
            self.by_name[cell].arrive(part, now, hosts)

    # -- spanning gangs --------------------------------------------------------------------------

    def part_started(self, part_id: str, cell: _CellLoop, now: float) -> None:
        gang = self.gangs[part_id.split(PART)[0]]
        gang.held_since[cell.name] = now
        if len(gang.held_since) < len(gang.parts):
            return
        gang.committed_s = now
        if gang.first_commit_s is None:
            gang.first_commit_s = now
        for c, since in gang.held_since.items():
            gang.idle_gpu_s += gang.gpus[c] * (now - since)
        ranked: list[str] = []
        leaves = 0
        for c in gang.parts:
            loop = self.by_name[c]
            act = loop.active[f"{gang.trace.id}{PART}{c}"]
            ranked.extend(loop.names[h] for h, _ in act.run.hosts)
            leaves += act.leaves
        hosts_all = sum(gang.parts.values())
        gang.leaves = leaves
        gang.min_leaves = min_leaf_span(
            hosts_all, self.config.hosts_per_leaf if self.full is None else self.full.hosts_per_leaf
        )
        if self.full is not None:
            ranked.sort(key=self.full.view.rank_key)
            gang.stretch = self.full.stretch(ranked, False, self.config.cost.comm_fraction)
        else:
            gang.stretch = self.config.cost.stretch(hosts_all, leaves, gang.min_leaves)
        restore = self.config.cost.checkpoint_restore_s if gang.restarts else 0.0
        for c in gang.parts:
            loop = self.by_name[c]
            part = f"{gang.trace.id}{PART}{c}"
            loop.active[part].stretch = gang.stretch
            loop.active[part].restore_s = restore
            loop.run_until_end(part, now, restore, gang.remaining_s * gang.stretch)

    def part_stopped(self, part_id: str, cell: _CellLoop, now: float) -> None:
        """A part was preempted. Before the commit only that part goes back to its queue (the others
        keep holding); after it the gang stops: every part back to its queue, progress kept."""
        if self.stopping:
            return
        gang = self.gangs[part_id.split(PART)[0]]
        gang.preemptions += 1
        since = gang.held_since.pop(cell.name, now)
        if gang.committed_s is None:
            gang.idle_gpu_s += gang.gpus[cell.name] * (now - since)
            cell.progress_of[part_id].remaining_s = gang.remaining_s
            return
        ran = now - gang.committed_s
        restore = self.config.cost.checkpoint_restore_s if gang.restarts else 0.0
        gang.remaining_s = max(0.0, gang.remaining_s - max(0.0, ran - restore) / gang.stretch)
        gang.restarts += 1
        gang.committed_s = None
        self.stopping = True
        for c in gang.parts:
            loop = self.by_name[c]
            part = f"{gang.trace.id}{PART}{c}"
            if c != cell.name and part in loop.active:
                gang.held_since.pop(c, None)
                loop.progress_of[part].preemptions += 1
                loop.requeue(part, now, checkpointed=False)
                loop.wake(now)
            loop.progress_of[part].remaining_s = gang.remaining_s
        self.stopping = False

    def part_ended(self, part_id: str, cell: _CellLoop, now: float) -> None:
        gang = self.gangs[part_id.split(PART)[0]]
        gang.ends[cell.name] = now
        if len(gang.ends) < len(gang.parts):
            return
        assert gang.first_commit_s is not None
        self.spans.append(
            GangSpan(
                id=gang.trace.id,
                gpus=gang.trace.gpus,
                hosts=sum(gang.parts.values()),
                parts=dict(gang.parts),
                submit_s=gang.trace.submit_s,
                sent_s=gang.sent_s,
                commit_s=gang.first_commit_s,
                end_s=now,
                idle_gpu_s=gang.idle_gpu_s,
            )
        )
        self.in_flight = None
        self.send_next_gang(now)

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> None:
        trace, arrivals, cells = self.trace, self.arrivals, self.cells
        while True:
            t_arr = trace[arrivals[self.next]].submit_s if self.next < len(arrivals) else math.inf
            now = min([t_arr, *(c.next_at() for c in cells)])
            if now == math.inf:
                break
            for c in cells:
                c.handle(now, before_arrivals=True)
            while self.next < len(arrivals) and trace[arrivals[self.next]].submit_s == now:
                self.route(trace[arrivals[self.next]], now)
                self.next += 1
            for c in cells:
                c.handle(now)
                c.cycle(now)
        waiting = [g for g in self.gangs if g not in {s.id for s in self.spans}]
        if waiting:
            raise RuntimeError(f"spanning gangs never ran: {waiting[:3]}")


def simulate_cells(
    trace: Sequence[TraceJob],
    config: SimConfig,
    cells: int,
    *,
    progress: Callable[[float], None] | None = None,
) -> CellsResult:
    """Replay `trace` on the configured cluster cut into `cells` cells (module docstring);
    deterministic. With one cell the outcomes are `simulate(trace, config)`'s."""
    started_wall, started_cpu = time.perf_counter(), time.process_time()
    driver = _Driver(trace, config, cells)
    driver.run()
    wall, cpu = time.perf_counter() - started_wall, time.process_time() - started_cpu
    label = config.label or config.policy
    per_cell = [c.result(f"{label}/{c.name}", wall, cpu) for c in driver.cells]
    outcomes = [o for r in per_cell for o in r.outcomes if PART not in o.id]
    by_span = {s.id: s for s in driver.spans}
    for gang_id, gang in driver.gangs.items():
        span = by_span[gang_id]
        t = gang.trace
        outcomes.append(
            JobOutcome(
                id=t.id,
                gpus=t.gpus,
                hosts=span.hosts,
                submit_s=t.submit_s,
                first_start_s=span.commit_s,
                end_s=span.end_s,
                duration_s=t.duration_s,
                preemptions=gang.preemptions,
                leaves=gang.leaves,
                min_leaves=gang.min_leaves,
            )
        )
    whole = SimResult(
        label=label,
        outcomes=sorted(outcomes, key=lambda o: o.id),
        busy_gpu_s=sum(r.busy_gpu_s for r in per_cell),
        total_gpus=sum(r.total_gpus for r in per_cell),
        cycles=sum(r.cycles for r in per_cell),
        wall_s=wall,
        cpu_s=cpu,
        multi_node_starts=sum(r.multi_node_starts for r in per_cell),
        minimal_span_starts=sum(r.minimal_span_starts for r in per_cell),
        sharp_starts=sum(r.sharp_starts for r in per_cell),
        minimal_tier_starts=sum(r.minimal_tier_starts for r in per_cell),
    )
    if progress is not None:
        progress(1.0)
    return CellsResult(
        cells=cells,
        whole=whole,
        per_cell=per_cell,
        cell_of=driver.cell_of,
        decisions=dict(sorted(driver.decisions.items())),
        routed_waiting=driver.routed_waiting,
        fragmented=driver.fragmented,
        spans=sorted(driver.spans, key=lambda s: s.id),
        router_cpu_s=driver.router_cpu_s,
    )


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank quantile (`SimResult.summary`'s p99 rule): the ceil(q n)-th smallest."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def cells_summary(result: CellsResult) -> dict[str, float | int | str]:
    """The table row of one k: queueing delay (mean, p50, p90, p99), JCT, utilisation, spans, routing."""
    whole = result.whole
    base = whole.summary()
    waits = [o.first_start_s - o.submit_s for o in whole.outcomes]
    jct = [o.end_s - o.submit_s for o in whole.outcomes]
    waited = sum(1 for w in waits if w > 0)
    gang_waits = [o.first_start_s - o.submit_s for o in whole.outcomes if o.hosts > 1]
    return {
        "cells": result.cells,
        "jobs": len(whole.outcomes),
        "avg_queue_s": statistics.fmean(waits) if waits else 0.0,
        "p50_queue_s": quantile(waits, 0.5),
        "p90_queue_s": quantile(waits, 0.9),
        "p99_queue_s": quantile(waits, 0.99),
        "avg_jct_s": statistics.fmean(jct) if jct else 0.0,
        "p50_jct_s": quantile(jct, 0.5),
        "p99_jct_s": quantile(jct, 0.99),
        "utilisation": base["utilisation"],
        "makespan_s": base["makespan_s"],
        "preemptions": base["preemptions"],
        "jobs_waited": waited,
        "gangs": len(gang_waits),
        "avg_gang_queue_s": statistics.fmean(gang_waits) if gang_waits else 0.0,
        "routed_fits": result.decisions.get("fits", 0),
        "routed_waits": result.routed_waiting,
        "routed_waits_fit_union": result.fragmented,
        "spanned": len(result.spans),
        "span_idle_gpu_s": sum(s.idle_gpu_s for s in result.spans),
        "span_queue_s": sum(s.commit_s - s.submit_s for s in result.spans),
        "cycles": whole.cycles,
        "router_cpu_s": result.router_cpu_s,
        "cpu_s": whole.cpu_s,
        "wall_s": whole.wall_s,
    }


def time_window(trace: Sequence[TraceJob], start_s: float, end_s: float) -> list[TraceJob]:
    """The jobs submitted in [start_s, end_s) of `trace` (its own times), in submit order, with times
    counted from the first of them; ids kept (a Philly job keeps its index in the whole trace)."""
    inside = sorted((t for t in trace if start_s <= t.submit_s < end_s), key=lambda t: t.submit_s)
    if not inside:
        return []
    origin = inside[0].submit_s
    return [msgspec.structs.replace(t, submit_s=t.submit_s - origin) for t in inside]
