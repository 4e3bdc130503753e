"""The cells router: fits now by placement score, else the earliest estimated start, spans when
larger than any cell (the simulation that measures it is libs/sim/ibpool_sim/cells_sim.py)."""

from __future__ import annotations

import datetime as dt

import msgspec
import pytest

from ibpool_core.sched import framework as fw
from ibpool_core.sched.cells import Cell, RouteRequest, route
from ibpool_core.sched.framework_placer import FrameworkPlacer, leaf_fabric
from ibpool_core.sched.jobs import FreeCapacity, Job, RunningJob
from ibpool_core.sched.profiles import SCHEDULER_PROFILE


def capacity(hosts: int, per_leaf: int = 4, free: dict[int, int] | None = None) -> FreeCapacity:
    free = free or {}
    return FreeCapacity(
        free=[free.get(h, 8) for h in range(hosts)], capacity=[8] * hosts, leaf_of=[h // per_leaf for h in range(hosts)]
    )


def job(job_id: str, gpus: int, hosts: int = 1, runtime: float = 100.0, submit: float = 0.0) -> Job:
    return Job(id=job_id, tenant="t", gpus=gpus, hosts=hosts, submit_time=submit, requested_runtime_s=runtime)


def busy_cell(name: str, hosts: int, until: float) -> Cell:
    """A cell whose every host runs an 8-GPU job planned to end at `until`."""
    running = [
        RunningJob(job=job(f"{name}-r{h}", 8), hosts=((h, 8),), started_at=0.0, planned_end=until) for h in range(hosts)
    ]
    return Cell(
        name=name, cluster=capacity(hosts, free=dict.fromkeys(range(hosts), 0)), running=running, hosts_per_leaf=4
    )


def cell(name: str, hosts: int = 4, free: dict[int, int] | None = None, queue: list[Job] | None = None) -> Cell:
    return Cell(name=name, cluster=capacity(hosts, free=free), queue=queue or [], hosts_per_leaf=4)


def test_a_job_that_fits_one_cell_only_goes_there() -> None:
    reply = route(RouteRequest(now=5.0, job=job("j", 8), cells=[busy_cell("a", 4, 500.0), cell("b")]))
    assert (reply.decision, reply.cell, reply.start_at) == ("fits", "b", 5.0)
    assert [e.fits_now for e in reply.estimates] == [False, True]
    assert reply.estimates[1].score is not None and reply.estimates[0].score is None


def test_among_cells_it_fits_the_tightest_placement_wins_and_ties_go_to_the_first() -> None:
    # b has a host with 2 GPUs free: a 2-GPU job fills it (score 100) where a would leave 6 free.
    cells = [cell("a"), cell("b", free={0: 2})]
    reply = route(RouteRequest(now=0.0, job=job("j", 2), cells=cells))
    assert reply.cell == "b"
    assert [e.score for e in reply.estimates] == [25.0, 100.0]
    tie = route(RouteRequest(now=0.0, job=job("j", 8), cells=[cell("a"), cell("b")]))
    assert tie.cell == "a"


def test_queued_jobs_that_fit_now_go_first() -> None:
    # a's one free host will be taken by its queued job: the new job does not fit a now, only b.
    a = cell("a", hosts=2, free={0: 0}, queue=[job("q", 8)])
    b = busy_cell("b", 2, 300.0)
    reply = route(RouteRequest(now=0.0, job=job("j", 8), cells=[a, b]))
    assert reply.decision == "waits"
    assert [e.fits_now for e in reply.estimates] == [False, False]


def test_when_no_cell_fits_now_the_earliest_estimated_start_wins() -> None:
    cells = [busy_cell("a", 4, 900.0), busy_cell("b", 4, 300.0)]
    reply = route(RouteRequest(now=0.0, job=job("j", 16, hosts=2), cells=cells))
    assert (reply.decision, reply.cell, reply.start_at) == ("waits", "b", 300.0)
    assert [e.start_at for e in reply.estimates] == [900.0, 300.0]
    assert not reply.fits_union_now


def test_a_gang_the_cells_hold_only_together_waits_and_is_counted() -> None:
    # Each cell has one whole host free; the 2-host gang fits neither, both together.
    a = Cell(
        name="a",
        cluster=capacity(2, free={1: 0}),
        running=[RunningJob(job=job("ra", 8), hosts=((1, 8),), started_at=0.0, planned_end=400.0)],
        hosts_per_leaf=4,
    )
    b = Cell(
        name="b",
        cluster=capacity(2, free={0: 0}),
        running=[RunningJob(job=job("rb", 8), hosts=((0, 8),), started_at=0.0, planned_end=200.0)],
        hosts_per_leaf=4,
    )
    reply = route(RouteRequest(now=0.0, job=job("g", 16, hosts=2), cells=[a, b]))
    assert (reply.decision, reply.cell, reply.start_at, reply.fits_union_now) == ("waits", "b", 200.0, True)


def test_a_gang_larger_than_any_cell_spans_the_cells_with_most_room_first() -> None:
    cells = [cell("a", hosts=4, free={0: 0, 1: 0}), cell("b", hosts=4), cell("c", hosts=2)]
    reply = route(RouteRequest(now=0.0, job=job("big", 48, hosts=6), cells=cells))
    assert reply.decision == "spans"
    assert [(p.cell, p.hosts, p.gpus) for p in reply.parts] == [("b", 4, 32), ("a", 2, 16)]
    assert not any(e.holds for e in reply.estimates)
    assert reply.fits_union_now  # b's 4 + a's 2 + c's 2 free hosts


def test_uneven_shares_are_split_with_the_gang() -> None:
    reply = route(RouteRequest(now=0.0, job=job("odd", 30, hosts=5), cells=[cell("a"), cell("b")]))
    assert reply.decision == "spans"
    assert [(p.hosts, p.gpus) for p in reply.parts] == [(4, 24), (1, 6)]
    assert sum(p.gpus for p in reply.parts) == 30


def test_larger_than_every_cell_together_is_infeasible_data_not_an_error() -> None:
    reply = route(RouteRequest(now=0.0, job=job("huge", 80, hosts=10), cells=[cell("a"), cell("b")]))
    assert reply.decision == "infeasible" and reply.cell is None and reply.parts == []
    assert "needs 10 hosts" in reply.reason


def test_no_cell_or_a_repeated_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="no cell"):
        route(RouteRequest(now=0.0, job=job("j", 1), cells=[]))
    with pytest.raises(ValueError, match="named twice"):
        route(RouteRequest(now=0.0, job=job("j", 1), cells=[cell("a"), cell("a")]))


def framework_cell(name: str, free: dict[int, int]) -> tuple[Cell, FrameworkPlacer]:
    names = [f"{name}-h{h}" for h in range(8)]
    index = leaf_fabric({n: f"{name}-leaf{h // 4}" for h, n in enumerate(names)})
    hosts = [fw.HostState(name=n, gpu_model="", total_gpus=8, free_gpus=8) for n in names]
    placer = FrameworkPlacer(
        fw.Framework(fw.build_profile(SCHEDULER_PROFILE)),
        fw.ClusterView(index, hosts),
        names,
        {},
        dt.datetime(2017, 1, 1, tzinfo=dt.UTC),
    )
    return Cell(name=name, cluster=capacity(8, free=free), hosts_per_leaf=4, placer=placer), placer


def test_with_the_framework_the_scheduler_score_decides_and_nothing_is_left_in_the_placer() -> None:
    a, pa = framework_cell("a", {})
    b, pb = framework_cell("b", {0: 4})
    request = RouteRequest(now=0.0, job=job("j", 4), cells=[a, b])
    reply = route(request)
    assert reply.decision == "fits"
    scores = [e.score for e in reply.estimates]
    assert all(s is not None for s in scores)
    assert reply.cell == ("b" if scores[1] > scores[0] else "a")  # type: ignore[operator]
    assert pa.results == {} and pb.results == {} and pa.reasons == {} and pb.reasons == {}


def test_the_same_request_gives_the_same_bytes() -> None:
    def request() -> RouteRequest:
        a, _ = framework_cell("a", {1: 2})
        b, _ = framework_cell("b", {0: 4})
        return RouteRequest(
            now=10.0,
            job=job("g", 24, hosts=3),
            cells=[a, b, busy_cell("c", 4, 50.0), cell("d", queue=[job("q", 16, hosts=2)])],
        )

    first = msgspec.json.encode(route(request()))
    assert msgspec.json.encode(route(request())) == first
    again = request()
    assert msgspec.json.encode(route(again)) == msgspec.json.encode(route(again))  # the placers' state does not leak
