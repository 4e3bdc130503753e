"""Cells: the cell (part of the cluster with a scheduler of its own) an arriving job goes to. Pure.

The cluster is split into cells, whole leaf groups each (docs/scale.md, "Past one control plane").
`route(RouteRequest) -> RouteReply` decides for one arriving job, from every cell's free capacity,
running jobs (with their planned ends) and queue (waiting jobs in its policy's order):

- `fits`: the job fits now in one cell at least, on the capacity left once the cell's queued jobs
  that fit now are placed (what the cell's next cycle would start first; `depth` of them at most).
  It goes to the cell whose placement of it scores best: the placement framework's `total_score`
  when the cell's placer is a `FrameworkPlacer` (the scheduler's own score), else a best-fit score,
  100 x the share of the placement's hosts' GPUs taken once it is placed (tighter is better).
- `waits`: it fits no cell now, one cell at least could hold it: the cell with the earliest
  estimated start (`sites.estimate_start`: list scheduling of the cell's queue on its running jobs'
  planned ends, with the core's `LeafPlacer`). `fits_union_now` says whether the cells' free hosts
  together would hold it now (the job waits only because the cluster is cut into cells).
- `spans`: no cell could hold it even empty, the cells together can: `parts`, one per cell, the
  cells taken by most hosts free for it now (then by index), each given as many of the gang's hosts
  as it has hosts for it, until the gang is complete. The caller reserves the parts in their cells
  and runs the gang once every part holds its hosts.
- `infeasible`: all the cells together could not hold it.

Ties go to the cell listed first. The same request gives the same reply (and the same bytes once
encoded): the only state touched is a `FrameworkPlacer`'s accelerator view, brought to each free
view before it places (its `results` and `reasons` for the job are removed again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from .framework_placer import FrameworkPlacer
from .jobs import FreeCapacity, Job, RunningJob, host_shares
from .placer import FreeView, LeafPlacer, Placement, Placer, min_leaf_span
from .sites import Site, estimate_start

Decision = Literal["fits", "waits", "spans", "infeasible"]


class Cell(msgspec.Struct, frozen=True, kw_only=True):
    """One cell as the router sees it. `queue`: its waiting jobs in its policy's order; `placer`: the
    placer its scheduler places with (None: `LeafPlacer`); `hosts_per_leaf`: its leaf groups' size."""

    name: str
    cluster: FreeCapacity
    running: Sequence[RunningJob] = ()
    queue: Sequence[Job] = ()
    hosts_per_leaf: int = 8
    placer: Placer | None = None


class RouteRequest(msgspec.Struct, frozen=True, kw_only=True):
    now: float
    job: Job
    cells: Sequence[Cell]
    safety_margin: float = 1.5
    depth: int = 64


class CellEstimate(msgspec.Struct, frozen=True, kw_only=True):
    """What the router found in one cell: `holds` whether the cell could ever hold the job (enough
    hosts), `fits_now`, the placement's `score` (when it fits now) and the estimated start
    (`start_at`; only computed when the job fits no cell now)."""

    cell: str
    holds: bool
    fits_now: bool = False
    score: float | None = None
    start_at: float | None = None


class SpanPart(msgspec.Struct, frozen=True, kw_only=True):
    cell: str
    hosts: int
    gpus: int


class RouteReply(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    decision: Decision
    cell: str | None = None
    parts: list[SpanPart] = []
    start_at: float | None = None
    fits_union_now: bool = False
    estimates: list[CellEstimate] = []
    reason: str = ""


def hosts_for(cluster: FreeCapacity, job: Job) -> int:
    """The hosts of `cluster` that could take one member of `job`'s gang (capacity, not free GPUs)."""
    need = host_shares(job)[0]
    return sum(1 for c in cluster.capacity if c >= need)


def _after_queue(cell: Cell, placer: Placer, depth: int) -> FreeView:
    """The cell's free view once the queued jobs that fit now are placed, in queue order."""
    view = FreeView.of(cell.cluster)
    for j in cell.queue[:depth]:
        span = min_leaf_span(j.hosts, cell.hosts_per_leaf) if j.hosts > 1 else None
        placement = placer.place(view, j, span)
        if placement is not None:
            view.apply(placement)
        _forget(placer, j.id)
    return view


def _forget(placer: Placer, job_id: str) -> None:
    """Drop what a `FrameworkPlacer` kept of the router's tries (its `results` and `reasons`)."""
    if isinstance(placer, FrameworkPlacer):
        placer.results.pop(job_id, None)
        placer.reasons.pop(job_id, None)


def _score(placer: Placer, view: FreeView, job: Job, placement: Placement) -> float:
    if isinstance(placer, FrameworkPlacer):
        result = placer.results.get(job.id)
        if result is not None:
            return float(result.total_score)
    hosts = [h for h, _ in placement]
    capacity = sum(view.capacity[h] for h in hosts)
    left = sum(view.free[h] for h in hosts) - sum(g for _, g in placement)
    return round(100.0 * (1.0 - left / capacity), 3) if capacity else 0.0


def _eligible_free(view: FreeView, job: Job) -> int:
    return view.hosts_with_at_least(host_shares(job)[0])


def route(request: RouteRequest) -> RouteReply:
    """The cell for `request.job` (see the module docstring); ValueError when there is no cell or a
    cell name repeats."""
    job, now, cells = request.job, request.now, list(request.cells)
    if not cells:
        raise ValueError(f"job {job.id}: no cell to route to")
    names = [c.name for c in cells]
    if len(set(names)) != len(names):
        raise ValueError(f"job {job.id}: a cell is named twice in {names}")
    holds = [hosts_for(c.cluster, job) >= job.hosts and job.gpus <= sum(c.cluster.capacity) for c in cells]
    views: list[FreeView] = []
    estimates: list[CellEstimate] = []
    best: tuple[float, int] | None = None  # (-score, index)
    for i, cell in enumerate(cells):
        placer = cell.placer if cell.placer is not None else LeafPlacer()
        view = _after_queue(cell, placer, request.depth)
        views.append(view)
        if not holds[i]:
            estimates.append(CellEstimate(cell=cell.name, holds=False))
            continue
        max_leaves = min_leaf_span(job.hosts, cell.hosts_per_leaf) if job.hosts > 1 else None
        placement = placer.place(view, job, max_leaves) if job.gpus <= view.total_free else None
        if placement is None:
            _forget(placer, job.id)
            estimates.append(CellEstimate(cell=cell.name, holds=True))
            continue
        score = _score(placer, view, job, placement)
        _forget(placer, job.id)
        estimates.append(CellEstimate(cell=cell.name, holds=True, fits_now=True, score=score))
        if best is None or (-score, i) < best:
            best = (-score, i)
    if best is not None:
        chosen = cells[best[1]]
        return RouteReply(
            job_id=job.id,
            decision="fits",
            cell=chosen.name,
            start_at=now,
            estimates=estimates,
            reason=f"fits now; best placement score {-best[0]:g} among {sum(e.fits_now for e in estimates)} cells",
        )
    fits_union = sum(_eligible_free(v, job) for v in views) >= job.hosts
    if any(holds):
        soonest: tuple[float, int] | None = None
        for i, cell in enumerate(cells):
            if not holds[i]:
                continue
            site = Site(
                name=cell.name,
                cluster=cell.cluster,
                running=cell.running,
                queue=cell.queue,
                hosts_per_leaf=cell.hosts_per_leaf,
            )
            start = estimate_start(site, job, now, safety_margin=request.safety_margin, depth=request.depth)
            estimates[i] = msgspec.structs.replace(estimates[i], start_at=start)
            if start is not None and (soonest is None or (start, i) < soonest):
                soonest = (start, i)
        if soonest is None:  # a cell holds it by host count but the estimate never places it
            soonest = (now, holds.index(True))
        return RouteReply(
            job_id=job.id,
            decision="waits",
            cell=cells[soonest[1]].name,
            start_at=soonest[0],
            fits_union_now=fits_union,
            estimates=estimates,
            reason=f"fits no cell now; earliest estimated start {soonest[0] - now:.0f} s from now"
            + ("; the cells' free hosts together would hold it now" if fits_union else ""),
        )
    total_hosts = sum(hosts_for(c.cluster, job) for c in cells)
    if total_hosts < job.hosts:
        return RouteReply(
            job_id=job.id,
            decision="infeasible",
            estimates=estimates,
            reason=f"needs {job.hosts} hosts; the cells together have {total_hosts} that could take a member",
        )
    order = sorted(range(len(cells)), key=lambda i: (-_eligible_free(views[i], job), i))
    shares = host_shares(job)
    parts: list[SpanPart] = []
    given = 0
    for i in order:
        take = min(hosts_for(cells[i].cluster, job), job.hosts - given)
        if take <= 0:
            break
        parts.append(SpanPart(cell=cells[i].name, hosts=take, gpus=sum(shares[given : given + take])))
        given += take
    return RouteReply(
        job_id=job.id,
        decision="spans",
        parts=parts,
        fits_union_now=fits_union,
        estimates=estimates,
        reason=f"larger than any cell; spans {len(parts)} cells ({', '.join(p.cell for p in parts)})",
    )
