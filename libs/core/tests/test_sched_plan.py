"""`plan(PlanRequest) -> PlanReply`: the decision the scheduler service and the simulator share.

Requests are built as data; no service, no database. Covered: queues decided in turn on what the
earlier ones left, oldest first; starts placed in full on a real fabric (rank order, tier, SHARP
trees bounded by the limits and by the trees already held); the leaf placer's placements; the
reused placer (an accelerator) decides as a fresh one does; the same request gives the same bytes.
"""

from __future__ import annotations

import datetime as dt

import msgspec
import pytest

from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.index import FabricIndex
from ibpool_core.sched.cycle import CycleConfig, Preemption, SchedulingReply, Start
from ibpool_core.sched.framework import ClusterView, Framework, HostState, build_profile
from ibpool_core.sched.framework_placer import FrameworkPlacer
from ibpool_core.sched.jobs import FreeCapacity, Job
from ibpool_core.sched.plan import (
    LEAF_PLACER_NO_SHARP,
    SINGLE_HOST_NO_SHARP,
    PlanReply,
    PlanRequest,
    QueueRequest,
    placed_starts,
    plan,
)
from ibpool_core.sched.profiles import SCHEDULER_PROFILE
from ibpool_core.sched.queueing import make_policy
from ibpool_core.sched.sharp import SharpLimits

from .sched_builders import cluster, job

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
# 2-tier fat-tree, 3:1 oversubscribed, SHARP on every switch: 24 hosts in leaves of 6.
FABRIC = "fat_tree_2tier:hosts=24,radix=8,oversubscription=3,sharp=true"


def fabric_placer(spec: str = FABRIC) -> tuple[FrameworkPlacer, list[str], FreeCapacity]:
    index = FabricIndex(generate(spec))
    names = [h for h in index.hosts if index.rails(h)]
    view = ClusterView(index, [HostState(name=n, gpu_model="", total_gpus=8, free_gpus=8) for n in names])
    placer = FrameworkPlacer(Framework(build_profile(SCHEDULER_PROFILE)), view, names, {}, T0, sample=0)
    leaf_of = [view.group_of[n] for n in names]
    return placer, names, FreeCapacity(free=[8] * len(names), capacity=[8] * len(names), leaf_of=leaf_of)


def gang(name: str, hosts: int, *, submit: float = 0.0, level: int | None = None) -> Job:
    return Job(
        id=name,
        tenant="t",
        gpus=8 * hosts,
        hosts=hosts,
        submit_time=submit,
        topology="required" if level is not None else None,
        topology_level=level or 1,
    )


def on_fabric(queues: list[QueueRequest], **kw: object) -> tuple[PlanReply, FrameworkPlacer, list[str]]:
    placer, names, free = fabric_placer()
    request = PlanRequest(now=100.0, queues=queues, cluster=free, names=names, placer=placer, **kw)  # type: ignore[arg-type]
    return plan(request), placer, names


def fifo(*jobs: Job, config: CycleConfig | None = None, name: str = "") -> QueueRequest:
    return QueueRequest(
        name=name, jobs=list(jobs), policy=make_policy("fifo"), config=config or CycleConfig(hosts_per_leaf=6)
    )


def test_a_plan_needs_a_queue() -> None:
    with pytest.raises(ValueError, match="one queue at least"):
        plan(PlanRequest(now=0.0, queues=[], cluster=cluster(2), names=["a", "b"]))


def test_the_queue_whose_oldest_job_waited_longest_decides_first_on_what_is_free() -> None:
    # two hosts of 8 GPUs; each queue wants both hosts whole: only the older queue's job starts
    late = QueueRequest(name="a", jobs=[job("late", 16, submit=50)], policy=make_policy("fifo"))
    early = QueueRequest(name="b", jobs=[job("early", 16, submit=10)], policy=make_policy("fifo"))
    reply = plan(PlanRequest(now=60.0, queues=[late, early], cluster=cluster(2, per_leaf=2), names=["h0", "h1"]))
    assert [s.job_id for s in reply.starts] == ["early"]
    assert "late" in reply.waiting and reply.order == "fifo,fifo"


def test_the_leaf_placer_places_by_index_and_says_why_sharp_is_off() -> None:
    reply = plan(
        PlanRequest(
            now=0.0,
            queues=[fifo(job("pair", 16), job("one", 2, submit=1), config=CycleConfig(hosts_per_leaf=2))],
            cluster=cluster(4, per_leaf=2),
            names=["h0", "h1", "h2", "h3"],
        )
    )
    placed = {s.job_id: s.placement for s in reply.starts}
    assert placed["pair"].ranks == ["h0", "h1"] and placed["pair"].sharp_reason == LEAF_PLACER_NO_SHARP
    assert placed["one"].sharp_reason == SINGLE_HOST_NO_SHARP and placed["one"].tier is None


def test_starts_on_a_fabric_are_ranked_tiered_and_hold_sharp_trees() -> None:
    reply, placer, _ = on_fabric(
        [fifo(gang("leaf", 4, level=1), gang("spine", 8, submit=1, level=2))],
        fabric_version=7,
        sharp_limits=SharpLimits(),
    )
    placed = {s.job_id: s.placement for s in reply.starts}
    index = placer.view.index
    for name, level in (("leaf", 1), ("spine", 2)):
        p = placed[name]
        covering = index.covering_subtree(p.ranks)
        assert covering is not None and covering.level == p.tier and p.tier is not None and p.tier <= level
        assert p.fabric_version == 7
        assert p.sharp and p.sharp_tree is not None and p.nccl_env
        assert p.ranks == sorted(p.ranks, key=placer.view.rank_key)  # ranks along the fabric


def test_sharp_trees_are_bounded_by_the_limits_and_by_the_trees_already_held() -> None:
    # Quantum HDR: one tree per switch. The first gang takes its leaf's tree; with that tree held,
    # a second plan's gang under the same leaf gets none and says why.
    limits = SharpLimits(per="switch", trees_per_switch=1)
    first, _, _ = on_fabric([fifo(gang("a", 2, level=1))], sharp_limits=limits)
    (a,) = first.starts
    assert a.placement.sharp and a.placement.sharp_tree is not None
    again, _, _ = on_fabric(
        [fifo(gang("b", 2, level=1))], sharp_limits=limits, sharp_held={"a": a.placement.sharp_tree}
    )
    (b,) = again.starts
    assert b.placement.ranks == a.placement.ranks  # the same free cluster: the same leaf
    assert not b.placement.sharp and b.placement.sharp_tree is None and b.placement.nccl_env == {}
    assert b.placement.sharp_reason.startswith("SHARP-capable, but")
    unbounded, _, _ = on_fabric([fifo(gang("c", 2, level=1))], sharp_held={"a": a.placement.sharp_tree})
    assert unbounded.starts[0].placement.sharp  # no limits: SHARP on, no tree counted


def test_a_reused_placer_decides_as_a_fresh_one_and_the_same_request_gives_the_same_bytes() -> None:
    queues = [fifo(gang("g", 3, level=1), job("s", 4, submit=1), gang("w", 5, submit=2, level=2))]
    fresh, placer, names = on_fabric(queues)
    placer.start_cycle({}, T0)  # the service's reuse of last cycle's placer
    _, _, free = fabric_placer()
    reused = plan(PlanRequest(now=100.0, queues=queues, cluster=free, names=names, placer=placer))
    assert msgspec.json.encode(reused) == msgspec.json.encode(fresh)
    assert len(fresh.starts) == 3


def test_a_job_preempted_or_killed_in_the_plan_gives_its_sharp_tree_to_the_starts() -> None:
    limits = SharpLimits(per="switch", trees_per_switch=1)
    first, placer, names = on_fabric([fifo(gang("victim", 2, level=1))], sharp_limits=limits)
    (victim,) = first.starts
    assert victim.placement.sharp_tree is not None
    # The same hosts go to "g" in a plan that preempts the victim: its leaf's only tree is free again.
    start = Start(job_id="g", hosts=victim.hosts, leaves=1, min_leaves=1, planned_end=1.0)
    _, _, free = fabric_placer()
    request = PlanRequest(
        now=0.0,
        queues=[],
        cluster=free,
        names=names,
        placer=placer,
        sharp_limits=limits,
        sharp_held={"victim": victim.placement.sharp_tree},
    )
    preempting = SchedulingReply(order="x", starts=[start], preemptions=[Preemption(job_id="victim", for_job_id="g")])
    (g,) = placed_starts(request, preempting)
    assert g.placement.sharp and g.placement.sharp_tree == victim.placement.sharp_tree
    killing = SchedulingReply(order="x", starts=[start], kills=["victim"])
    assert placed_starts(request, killing)[0].placement.sharp
    keeping = SchedulingReply(order="x", starts=[start])  # the victim runs on: no tree for "g"
    assert not placed_starts(request, keeping)[0].placement.sharp
