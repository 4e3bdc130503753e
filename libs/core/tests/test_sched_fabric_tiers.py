"""Topology constraints at every tier of a real fabric, decided by the cycle with the framework placer.

The fabric is a 3-tier rail-optimised one (2 rails, scalable units of 2 hosts, radix 8): tier 1
groups (one scalable unit: its rail leaves and 2 hosts), tier 2 groups of 8 hosts (a block of
scalable units under its pod spines), tier 3 all 16. Every placement is checked against the
fabric's own covering subtree; "required" is never wider than asked, "preferred" waits for its
tightest tier until relaxed, and a host the fabric does not have only ever runs single-host work.
"""

from __future__ import annotations

import datetime as dt

import pytest

from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.index import FabricIndex
from ibpool_core.sched.cycle import CycleConfig, SchedulingReply, SchedulingRequest, schedule
from ibpool_core.sched.framework import ClusterView, Framework, HostState, build_profile, tier_name
from ibpool_core.sched.framework_placer import FrameworkPlacer
from ibpool_core.sched.jobs import FreeCapacity, Job, TopologyConstraint
from ibpool_core.sched.profiles import SCHEDULER_PROFILE
from ibpool_core.sched.queueing import make_policy

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
FABRIC = FabricIndex(generate("rail_optimised:hosts=16,rails=2,su_size=2,radix=8"))
HOSTS = list(FABRIC.hosts)  # dgx001..dgx016
RELAX_S = 600.0


def tier_of(hosts: list[str]) -> int | None:
    sub = FABRIC.covering_subtree(hosts)
    return sub.level if sub is not None else None


def cycle(
    jobs: list[Job],
    busy: dict[str, int] | None = None,
    extra: tuple[str, ...] = (),
    now: float = 0.0,
) -> tuple[SchedulingReply, list[str], FrameworkPlacer]:
    """One cycle on the fabric's hosts (8 GPUs each, `busy` of them taken) plus `extra` hosts the
    fabric does not have."""
    busy = busy or {}
    names = HOSTS + list(extra)
    states = [HostState(name=n, gpu_model="H100", total_gpus=8, free_gpus=8 - busy.get(n, 0)) for n in names]
    view = ClusterView(FABRIC, states, off_fabric=True)
    placer = FrameworkPlacer(Framework(build_profile(SCHEDULER_PROFILE)), view, names, {}, NOW)
    group = {n: g for g, hs in enumerate(view.group_hosts) for n in hs}
    cluster = FreeCapacity(
        free=[s.free_gpus for s in states], capacity=[8] * len(names), leaf_of=[group[n] for n in names]
    )
    request = SchedulingRequest(
        now=now,
        queue=jobs,
        running=[],
        cluster=cluster,
        policy=make_policy("fifo"),
        config=CycleConfig(backfill="easy", span_relax_after_s=RELAX_S, hosts_per_leaf=2),
        placer=placer,
    )
    return schedule(request), names, placer


def gang(
    job_id: str, nodes: int, constraint: TopologyConstraint, level: int, submit: float = 0.0, gpus: int = 8
) -> Job:
    return Job(
        id=job_id,
        tenant="t",
        gpus=gpus * nodes,
        hosts=nodes,
        submit_time=submit,
        topology=constraint,
        topology_level=level,
    )


# Hosts with GPUs busy, so that no tier-1 group (2 hosts) is wholly free: one host of each SU half used.
ONE_PER_SU_BUSY = {h: 4 for h in HOSTS[::2]}


@pytest.mark.parametrize(
    ("name", "job", "busy", "want_tier"),
    [
        ("required tier 1 fits a free unit", gang("g", 2, "required", 1), {}, 1),
        ("required tier 2 lands at tier 1 when it can", gang("g", 2, "required", 2), {}, 1),
        ("required tier 2, units half busy: tier 2", gang("g", 2, "required", 2), ONE_PER_SU_BUSY, 2),
        ("required tier 2, 8 hosts: one block", gang("g", 8, "required", 2), {}, 2),
        ("required tier 3, 16 hosts: the whole fabric", gang("g", 16, "required", 3), {}, 3),
        ("preferred, 4 hosts: its tightest tier is 2", gang("g", 4, "preferred", 1), {}, 2),
        ("preferred, units half busy: waits (not relaxed)", gang("g", 2, "preferred", 1), ONE_PER_SU_BUSY, None),
    ],
)
def test_a_gang_lands_within_its_tier_or_waits(
    name: str, job: Job, busy: dict[str, int], want_tier: int | None
) -> None:
    reply, names, placer = cycle([job], busy)
    if want_tier is None:
        assert not reply.starts, name
        assert job.id in reply.waiting, name
        return
    (start,) = reply.starts
    hosts = [names[h] for h, _ in start.hosts]
    assert len(hosts) == job.hosts
    assert tier_of(hosts) == want_tier, name
    assert placer.results[job.id].covering_level == want_tier


@pytest.mark.parametrize("level", [1, 2])
def test_a_required_gang_that_no_group_of_its_tier_holds_waits_and_says_the_tier(level: int) -> None:
    # tier 1 groups hold 2 hosts, tier 2 groups 8: one more host than a group never fits
    size = {1: 3, 2: 9}[level]
    reply, _, placer = cycle([gang("big", size, "required", level)])
    assert not reply.starts
    wait = reply.waiting["big"]
    assert wait.code == "unresolvable"
    why = wait.text() + " " + placer.reasons.get("big", "")
    assert tier_name(level) in why, why


def test_a_required_gang_is_never_placed_wider_than_its_tier_over_many_shapes() -> None:
    """Every busy pattern of a seeded sweep: a required gang's hosts are always within its tier."""
    import random

    rng = random.Random(7)
    placed = 0
    for _ in range(60):
        busy = {h: rng.choice([0, 0, 4, 8]) for h in HOSTS}
        level = rng.choice([1, 2, 3])
        nodes = rng.choice([2, 3, 4, 6, 8])
        reply, names, _ = cycle([gang("g", nodes, "required", level, gpus=4)], busy)
        for start in reply.starts:
            hosts = [names[h] for h, _ in start.hosts]
            tier = tier_of(hosts)
            assert tier is not None and tier <= level, (busy, level, nodes, hosts)
            placed += 1
    assert placed >= 20  # the sweep places, not only waits


def test_a_relaxed_preferred_gang_takes_the_lowest_tier_with_room() -> None:
    job = gang("g", 2, "preferred", 1)
    waiting, _, _ = cycle([job], ONE_PER_SU_BUSY, now=RELAX_S - 1)
    assert not waiting.starts
    reply, names, placer = cycle([job], ONE_PER_SU_BUSY, now=RELAX_S)
    (start,) = reply.starts
    assert tier_of([names[h] for h, _ in start.hosts]) == 2  # widened one tier, not to the top
    assert placer.results["g"].covering_level == 2


def test_a_host_off_the_fabric_runs_single_host_work_and_never_joins_a_gang() -> None:
    everything_busy = {h: 8 for h in HOSTS}
    extra = ("lonely-1", "lonely-2")
    single = Job(id="s", tenant="t", gpus=8, submit_time=0.0)
    reply, names, _ = cycle([gang("g", 2, "preferred", 1), single], everything_busy, extra, now=RELAX_S * 10)
    started = {s.job_id: [names[h] for h, _ in s.hosts] for s in reply.starts}
    assert started == {"s": ["lonely-1"]} or started == {"s": ["lonely-2"]}
    assert "g" in reply.waiting
