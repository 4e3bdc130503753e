"""The plugin framework as the cycle's placer: leaf fabric, telemetry, datasets, GPU model, gangs,
and the cycle's free view as the one account of free GPUs."""

from __future__ import annotations

import datetime as dt

import pytest

from ibpool_core.sched.cycle import CycleConfig, SchedulingRequest, schedule
from ibpool_core.sched.framework import ClusterView, Framework, HostState, Telemetry, build_profile
from ibpool_core.sched.framework_placer import AskHints, FrameworkPlacer, leaf_fabric
from ibpool_core.sched.jobs import FreeCapacity, Job
from ibpool_core.sched.placer import FreeView
from ibpool_core.sched.queueing import make_policy

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
HOT = Telemetry(gpu_util=0.95, temperature_c=84.0, memory_used=0.9)
PROFILE = {
    "score": [
        {"name": "topology", "weight": 10},
        {"name": "load", "weight": 2},
        {"name": "data-locality", "weight": 3},
        {"name": "link-health", "weight": 3},
        {"name": "binpack", "weight": 1},
    ],
    "reserve": [],
    "permit": [],
}


def setup(
    leaves: dict[str, str],
    free: dict[str, int] | None = None,
    telemetry: dict[str, Telemetry] | None = None,
    models: dict[str, str] | None = None,
    datasets: dict[str, list[str]] | None = None,
    hints: dict[str, AskHints] | None = None,
) -> tuple[FrameworkPlacer, FreeView, list[str]]:
    names = sorted(leaves)
    index = leaf_fabric(leaves)
    free = free or {}
    hosts = [
        HostState(
            name=n,
            gpu_model=(models or {}).get(n, "H100"),
            total_gpus=8,
            free_gpus=free.get(n, 8),
            telemetry=(telemetry or {}).get(n, Telemetry()),
        )
        for n in names
    ]
    view = ClusterView(index, hosts, datasets=datasets)
    placer = FrameworkPlacer(Framework(build_profile(PROFILE)), view, names, hints or {}, NOW)
    leaf_ids = {leaf: i for i, leaf in enumerate(sorted(set(leaves.values())))}
    fv = FreeView([free.get(n, 8) for n in names], [leaf_ids[leaves[n]] for n in names], 8)
    return placer, fv, names


def job(job_id: str, gpus: int, hosts: int = 1) -> Job:
    return Job(id=job_id, tenant="t", gpus=gpus, hosts=hosts, submit_time=0.0)


def test_compute_heavy_job_avoids_the_hot_host() -> None:
    placer, fv, names = setup({"a": "l1", "b": "l1"}, telemetry={"a": HOT})
    placement = placer.place(fv, job("j", 2), None)
    assert placement is not None and names[placement[0][0]] == "b"


def test_job_goes_to_a_host_holding_its_dataset_and_required_locality_waits_for_one() -> None:
    hints = {"j": AskHints(dataset="imagenet"), "r": AskHints(dataset="imagenet", data_locality="required")}
    placer, fv, names = setup(
        {"a": "l1", "b": "l1", "c": "l2"}, free={"c": 8}, datasets={"imagenet": ["c"]}, hints=hints
    )
    placement = placer.place(fv, job("j", 4), None)
    assert placement is not None and names[placement[0][0]] == "c"
    fv.take(placement[0][0], 4)
    fv.take(placement[0][0], 4)  # c full now
    assert placer.place(fv, job("r", 4), None) is None
    assert "r" in placer.reasons


def test_gpu_model_filter() -> None:
    hints = {"j": AskHints(gpu_model="A100")}
    placer, fv, names = setup({"a": "l1", "b": "l1"}, models={"b": "A100"}, hints=hints)
    placement = placer.place(fv, job("j", 1), None)
    assert placement is not None and names[placement[0][0]] == "b"


def test_gang_lands_on_one_leaf_and_follows_the_free_view() -> None:
    leaves = {f"h{i}": ("l1" if i < 4 else "l2") for i in range(8)}
    placer, fv, names = setup(leaves)
    fv.take(0, 8)  # l1 has 3 whole hosts left, l2 has 4
    placement = placer.place(fv, job("g", 32, hosts=4), 1)
    assert placement is not None
    assert {names[h] for h, _ in placement} == {"h4", "h5", "h6", "h7"}
    assert all(g == 8 for _, g in placement)
    # nothing is held by the framework: the same ask places again on the same view
    assert placer.place(fv, job("g2", 32, hosts=4), 1) is not None
    for h in (4, 5, 6, 7):
        fv.take(h, 8)
    assert placer.place(fv, job("g3", 32, hosts=4), 1) is None


def test_binpack_keeps_whole_hosts_free() -> None:
    placer, fv, names = setup({"a": "l1", "b": "l1"}, free={"a": 3})
    placement = placer.place(fv, job("j", 2), None)
    assert placement is not None and names[placement[0][0]] == "a"


def test_the_cycle_runs_with_the_framework_placer() -> None:
    placer, fv, names = setup({"a": "l1", "b": "l1"}, telemetry={"a": HOT})
    request = SchedulingRequest(
        now=0.0,
        queue=[job("j1", 4), job("j2", 4), job("j3", 8)],
        running=[],
        cluster=FreeCapacity(free=list(fv.free), capacity=[8, 8], leaf_of=list(fv.leaf_of)),
        policy=make_policy("fifo"),
        config=CycleConfig(),
        placer=placer,
    )
    reply = schedule(request)
    placed = {s.job_id: [names[h] for h, _ in s.hosts] for s in reply.starts}
    assert placed["j1"] == ["b"]  # the cool host first
    assert placed["j2"] == ["b"]  # then fill it (binpack), not the hot one
    assert placed["j3"] == ["a"]


def test_unknown_host_name_is_an_error() -> None:
    index = leaf_fabric({"a": "l1"})
    view = ClusterView(index, [HostState(name="a", gpu_model="H100", total_gpus=8, free_gpus=8)])
    with pytest.raises(ValueError, match="not in the placement view: b"):
        FrameworkPlacer(Framework(build_profile(PROFILE)), view, ["a", "b"], {}, NOW)


def test_a_sample_bounds_the_hosts_a_single_host_job_is_scored_on_but_keeps_dataset_holders() -> None:
    leaves = {f"h{i:02d}": "l1" for i in range(20)}
    free = {f"h{i:02d}": (2 if i < 10 else 8) for i in range(20)}
    placer, fv, names = setup(leaves, free=free, datasets={"ds": ["h19"]}, hints={"d": AskHints(dataset="ds")})
    placer.sample = 4
    sampled = placer.candidates(fv, job("j", 2))
    assert sampled is not None and len(sampled) == 4 and all(free[h] == 2 for h in sampled)
    with_data = placer.candidates(fv, job("d", 2))
    assert with_data is not None and "h19" in with_data
    placement = placer.place(fv, job("d", 2), None)
    assert placement is not None and names[placement[0][0]] == "h19"
