"""What a cycle's proposals carry besides GPUs, without a bus or database: the hosts of a gang in rank
order (assignments in that order too), whether SHARP is on and why (not), and the NCCL settings
that go into the proposed workload; how the job record keeps and drops that placement."""

from __future__ import annotations

import msgspec
import pytest

from ibpool_core.sched import framework as fw
from ibpool_core.sched import records as jobs
from ibpool_core.sched.cycle import CycleConfig, SchedulingReply, Start
from ibpool_core.sched.framework import Framework, build_profile
from ibpool_core.sched.framework_placer import FrameworkPlacer, leaf_fabric
from ibpool_core.sched.jobs import FreeCapacity
from ibpool_core.sched.plan import LEAF_PLACER_NO_SHARP, SINGLE_HOST_NO_SHARP, PlanRequest, placed_starts
from ibpool_core.sched.pool_cycle import CyclePlan, PlacementInputs, Proposal, plan_cycle
from ibpool_core.sched.queueing import make_policy
from ibpool_core.sched.records import JobPlacement, JobRecord
from ibpool_core.sched.sharp import SHARP_NCCL_ENV, SharpTree
from ibpool_proto.node import NodeRegistered
from ibpool_proto.pool import WorkloadSpec
from ibpool_scheduler.api import job_view
from ibpool_scheduler.service import DEFAULT_PROFILE

from .test_glue import T0, job, ledger_of, node

LEAF = "ibpool.io/leaf"


def labelled(node_id: str, leaf: str, sharp: bool = False) -> NodeRegistered:
    n = node(node_id, 8, leaf=leaf)
    return msgspec.structs.replace(n, labels={**n.labels, "ibpool.io/sharp": "true"} if sharp else n.labels)


def framework_plan(registered: list[NodeRegistered], live: list[JobRecord], **inputs: object) -> CyclePlan:
    placement = PlacementInputs(Framework(build_profile(DEFAULT_PROFILE)), **inputs)  # type: ignore[arg-type]
    ledger = ledger_of(*registered)
    return plan_cycle(ledger, live, T0, make_policy("fifo"), CycleConfig(), LEAF, placement=placement)


def only(plan: CyclePlan) -> Proposal:
    (p,) = plan.proposals
    return p


def host_order(p: Proposal) -> list[str]:
    return list(dict.fromkeys(a.node_id for a in p.assignments))


def test_a_gang_under_a_sharp_leaf_gets_sharp_and_the_nccl_settings() -> None:
    nodes = [labelled(f"n{i}", "a" if i <= 3 else "b", sharp=i > 3) for i in range(1, 7)]
    p = only(framework_plan(nodes, [job("g", 8, hosts=2)]))
    assert p.sharp is True
    assert p.nccl_env == SHARP_NCCL_ENV == {"NCCL_COLLNET_ENABLE": "1", "SHARP_COLL_ENABLE_SAT": "1"}
    assert "SHARP-capable" in p.sharp_reason, p.sharp_reason
    assert p.ranks == ["n4", "n5"] == host_order(p)


def test_a_gang_on_a_fabric_without_sharp_says_why_and_carries_no_settings() -> None:
    nodes = [labelled(f"n{i}", "a") for i in range(1, 4)]
    p = only(framework_plan(nodes, [job("g", 8, hosts=2)]))
    assert (p.sharp, p.nccl_env) == (False, {})
    assert p.sharp_reason == "the fabric has no SHARP-capable switch"


def test_a_gang_across_a_sharp_and_a_plain_leaf_says_which_switches_lack_it() -> None:
    # 4 hosts need both leaves (3 each); the spine above a plain leaf is not SHARP-capable
    nodes = [labelled(f"n{i}", "a" if i <= 3 else "b", sharp=i > 3) for i in range(1, 7)]
    p = only(framework_plan(nodes, [job("g", 8, hosts=4)]))
    assert p.sharp is False and p.nccl_env == {}
    assert "has switches without SHARP" in p.sharp_reason, p.sharp_reason


def test_a_gang_over_two_leaves_is_ranked_leaf_by_leaf_and_its_gpus_follow() -> None:
    # leaves interleaved by name: name order would cross between leaves at every step of the ring
    nodes = [labelled(f"n{i}", "a" if i % 2 else "b") for i in range(1, 5)]
    p = only(framework_plan(nodes, [job("g", 2, hosts=4)]))
    assert p.ranks == ["n1", "n3", "n2", "n4"]
    assert host_order(p) == p.ranks
    assert [a.gpu_index for a in p.assignments] == [0, 1] * 4


def test_a_single_host_job_has_no_sharp_and_says_its_reductions_stay_on_nvlink() -> None:
    p = only(framework_plan([labelled("n1", "a", sharp=True)], [job("s", 4)]))
    assert (p.sharp, p.ranks, p.nccl_env) == (False, ["n1"], {})
    assert p.sharp_reason == SINGLE_HOST_NO_SHARP


def test_the_leaf_placer_does_not_decide_sharp_and_says_so() -> None:
    ledger = ledger_of(*(labelled(f"n{i}", "a", sharp=True) for i in range(1, 3)))
    plan = plan_cycle(ledger, [job("g", 8, hosts=2)], T0, make_policy("fifo"), CycleConfig(), LEAF)
    p = only(plan)
    assert (p.sharp, p.sharp_reason, p.nccl_env) == (False, LEAF_PLACER_NO_SHARP, {})
    assert sorted(p.ranks) == ["n1", "n2"]


@pytest.mark.parametrize(
    ("workload", "env", "want"),
    [
        (None, {}, None),
        (None, {"NCCL_COLLNET_ENABLE": "1"}, WorkloadSpec(env={"NCCL_COLLNET_ENABLE": "1"})),
        (
            WorkloadSpec(command=["train"], env={"NCCL_COLLNET_ENABLE": "0", "A": "b"}),
            dict(SHARP_NCCL_ENV),
            WorkloadSpec(command=["train"], env={"NCCL_COLLNET_ENABLE": "0", "SHARP_COLL_ENABLE_SAT": "1", "A": "b"}),
        ),
        (WorkloadSpec(simulated_runtime_s=3.0), {}, WorkloadSpec(simulated_runtime_s=3.0)),
    ],
)
def test_the_proposed_workload_gets_the_placement_env_and_the_job_keeps_its_own(
    workload: WorkloadSpec | None, env: dict[str, str], want: WorkloadSpec | None
) -> None:
    assert jobs.workload_with_env(workload, env) == want


def test_the_record_keeps_the_placement_until_the_job_goes_back_to_the_queue() -> None:
    placed = JobPlacement(
        ranks=["n2", "n1"],
        sharp=True,
        sharp_reason="every switch ...",
        nccl_env=SHARP_NCCL_ENV,
        fabric_version=3,
        tier=1,
        sharp_tree=SharpTree(trees=1, switches=("0xa",), cables=("n1/0~0xa", "n2/0~0xa")),
    )
    j = jobs.proposed(job("g", 8, hosts=2), "p1", [], 1, placed)
    assert j.placement == placed
    granted = jobs.granted(j, "p1", ["n2", "n1"], T0)
    view = msgspec.to_builtins(job_view(granted))
    assert view["placement"] == {
        "ranks": ["n2", "n1"],
        "sharp": True,
        "sharp_reason": "every switch ...",
        "nccl_env": {"NCCL_COLLNET_ENABLE": "1", "SHARP_COLL_ENABLE_SAT": "1"},
        "fabric_version": 3,
        "tier": 1,
        "sharp_tree": {"trees": 1, "switches": ("0xa",), "cables": ("n1/0~0xa", "n2/0~0xa")},
    }
    assert view["nodes"] == ["n2", "n1"]
    assert jobs.finished(granted, "completed", "done", T0).placement == placed
    assert jobs.requeued(granted, "node failed", T0, None).placement is None
    assert jobs.rejected(j, "conflict", None).placement is None
    # a record stored before the field existed still decodes (no placement)
    old = msgspec.json.encode(job("old"))
    body = msgspec.json.decode(old)
    body.pop("placement")
    assert msgspec.json.decode(msgspec.json.encode(body), type=JobRecord).placement is None


def test_a_start_the_framework_did_not_admit_last_is_ranked_and_decided_again_on_the_fabric() -> None:
    # e.g. a placement made on a view with a preemption's GPUs freed: `placer.results` may not hold it
    names = ["n1", "n2", "n3", "n4"]
    fabric = leaf_fabric({"n1": "a", "n2": "b", "n3": "a", "n4": "b"}, sharp_leaves={"a", "b"})
    hosts = [fw.HostState(name=n, gpu_model="H100", total_gpus=8, free_gpus=8) for n in names]
    placer = FrameworkPlacer(Framework(build_profile(DEFAULT_PROFILE)), fw.ClusterView(fabric, hosts), names, {}, T0)
    started = Start(job_id="g", hosts=[(3, 2), (1, 2), (2, 2), (0, 2)], leaves=2, min_leaves=1, planned_end=1.0)
    request = PlanRequest(
        now=0.0,
        queues=[],
        cluster=FreeCapacity(free=[8] * 4, capacity=[8] * 4, leaf_of=[0, 1, 0, 1]),
        names=names,
        placer=placer,
    )
    (p,) = placed_starts(request, SchedulingReply(order="fifo", starts=[started]))
    assert p.placement.ranks == ["n1", "n3", "n2", "n4"]
    assert p.hosts == started.hosts and p.planned_end == 1.0
    assert p.placement.sharp is True and p.placement.nccl_env == SHARP_NCCL_ENV  # every leaf, so the spine, aggregates
    assert p.placement.tier == 2
