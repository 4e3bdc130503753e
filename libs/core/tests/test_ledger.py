import copy
import datetime as dt
from typing import NamedTuple

import msgspec
import pytest

from ibpool_core import workload
from ibpool_core.pool import allocate as al
from ibpool_core.pool import ledger as ledger_mod
from ibpool_core.pool.enforcement import DeviceShare, enforcement_for, parse_mig_instance
from ibpool_core.pool.ledger import Ledger, LedgerGap, apply, rebuild
from ibpool_core.pool.messages import (
    AllocationGranted,
    LedgerEvent,
    PoolNodeUpdated,
)
from ibpool_core.pool.mig import MigInstance, is_valid
from ibpool_core.pool.placement import PlacementRequest
from ibpool_core.pool.quotas import Share
from ibpool_proto.health import Cordoned, DrainRequested, GpuFailed, NodeFailed, NodeRecovered, Uncordoned
from ibpool_proto.node import NodeDeregistered
from ibpool_proto.pool import (
    AllocationExpired,
    AllocationRejected,
    AllocationReleased,
    AllocationRevoked,
    GpuAssignment,
    ReleaseAllocation,
    RenewLease,
    WorkloadSpec,
)
from libs.core.tests.pool_builders import H100, H100_MIB, L40S, T0, a, health, hops, node, pool, propose, quota, request


def decide(ledger: Ledger, cmd: al.Input, config: al.AllocatorConfig = al.DEFAULT_CONFIG) -> al.Decision:
    return al.decide(ledger, cmd, T0, hops=hops, config=config)


def outcome(d: al.Decision) -> str:
    if d.rejection is not None:
        return f"rejected:{d.rejection.reason}"
    kinds = {g.kind for g in d.granted}
    return f"granted:{kinds.pop()}" if len(kinds) == 1 else f"events:{[type(e).__name__ for e in d.events]}"


TWO = pool(node("n1"), node("n2"))  # version 2
WITH_L40S = pool(node("n1"), node("n2"), node("l1", model=L40S, memory=46068))
ONE_TAKEN = pool(node("n1"), node("n2"), propose("other", a("n1", 0)))  # version 3: n1 GPU 0 is someone else's
REREGISTERED = pool(node("n1"), node("n2"), node("n1", uuid_tag="-swapped"))  # version 3: n1's GPUs changed
DEREGISTERED = pool(node("n1"), node("n2"), node("n3"), health(NodeDeregistered, "n3", reason="off"))
TENANT_QUOTA = pool(node("n1"), node("n2"), quota("t1", 1500))  # version 3
QUEUE_QUOTA = pool(node("n1"), node("n2"), quota("q1", 500, scope="queue"))


class Case(NamedTuple):
    name: str
    ledger: Ledger
    command: al.Input
    want: str


CASES = [
    # every kind, proposed and requested
    Case("whole proposed", TWO, propose("j", a("n1", 0), a("n1", 1)), "granted:whole"),
    Case("fraction proposed", TWO, propose("j", a("n1", 0, milli=250, memory=20_000)), "granted:fraction"),
    Case("mig proposed", TWO, propose("j", a("n1", 0, mig="1g.10gb")), "granted:mig"),
    Case("gang proposed", TWO, propose("j", a("n1", 0), a("n1", 1), a("n2", 0), a("n2", 1)), "granted:gang"),
    Case("remote proposed", TWO, propose("j", a("n2", 0), client="n1"), "granted:remote"),
    Case("whole requested", TWO, request("j", "whole", gpus=2), "granted:whole"),
    Case("fraction requested", TWO, request("j", "fraction", milli=500), "granted:fraction"),
    Case("mig requested", TWO, request("j", "mig", mig_profile="3g.40gb"), "granted:mig"),
    Case("gang requested", TWO, request("j", "gang", gpus=2, hosts=2), "granted:gang"),
    Case("remote requested", TWO, request("j", "remote", client="n1"), "granted:remote"),
    Case("remote fraction requested", TWO, request("j", "remote", milli=300, client="n3"), "granted:remote"),
    Case(
        "fraction beside a fraction",
        pool(node("n1"), propose("o", a("n1", 0, milli=500), version=1)),
        propose("j", a("n1", 0, milli=500), version=2),
        "granted:fraction",
    ),
    Case("proposal on another GPU of a changed node", ONE_TAKEN, propose("j", a("n1", 1)), "granted:whole"),
    # invalid
    Case("no assignment", TWO, propose("j"), "rejected:invalid"),
    Case("unknown node", TWO, propose("j", a("n9", 0)), "rejected:invalid"),
    Case("unknown GPU", TWO, propose("j", a("n1", 5)), "rejected:invalid"),
    Case("GPU named twice", TWO, propose("j", a("n1", 0), a("n1", 0)), "rejected:invalid"),
    Case("milli zero", TWO, propose("j", a("n1", 0, milli=0)), "rejected:invalid"),
    Case("fraction memory over the GPU", TWO, propose("j", a("n1", 0, 500, memory=H100_MIB + 1)), "rejected:invalid"),
    Case("whole GPU without all its memory", TWO, propose("j", a("n1", 0, memory=1000)), "rejected:invalid"),
    Case("MIG on a GPU without MIG", WITH_L40S, propose("j", a("l1", 0, mig="1g.10gb"), version=3), "rejected:invalid"),
    Case("unknown MIG profile", TWO, propose("j", a("n1", 0, mig="9g.90gb")), "rejected:invalid"),
    Case("fraction beside a whole GPU", TWO, propose("j", a("n1", 0, 500), a("n1", 1)), "rejected:invalid"),
    Case("gang of fractions", TWO, propose("j", a("n1", 0, 500), a("n2", 0, 500)), "rejected:invalid"),
    Case("version from the future", TWO, propose("j", a("n1", 0), version=7), "rejected:invalid"),
    Case("no lease", TWO, propose("j", a("n1", 0), lease_s=0), "rejected:invalid"),
    Case("remote client too far", TWO, propose("j", a("n1", 0), client="far"), "rejected:invalid"),
    Case("remote client unreachable", TWO, propose("j", a("n1", 0), client="x"), "rejected:invalid"),
    Case("remote on two nodes", TWO, propose("j", a("n1", 0), a("n2", 0), client="n3"), "rejected:invalid"),
    Case("requested fraction of two GPUs", TWO, request("j", "fraction", milli=500, gpus=2), "rejected:invalid"),
    Case("requested gang of fractions", TWO, request("j", "gang", milli=500, hosts=2), "rejected:invalid"),
    Case("requested unknown MIG profile", TWO, request("j", "mig", mig_profile="9g.90gb"), "rejected:invalid"),
    Case("requested remote without a client", TWO, request("j", "remote"), "rejected:invalid"),
    Case("requested remote with every node too far", TWO, request("j", "remote", client="x"), "rejected:invalid"),
    Case("requested whole with a client", TWO, request("j", "whole", client="n1"), "rejected:invalid"),
    # stale
    Case("hardware changed after the version", REREGISTERED, propose("j", a("n1", 0)), "rejected:stale"),
    Case("node removed after the version", DEREGISTERED, propose("j", a("n3", 0), version=3), "rejected:stale"),
    Case("coarse: node changed though the GPU is free", ONE_TAKEN, propose("j", a("n1", 1)), "rejected:stale"),
    # conflict and would_exceed_capacity
    Case("GPU taken after the version", ONE_TAKEN, propose("j", a("n1", 0)), "rejected:conflict"),
    Case(
        "GPU taken before the version", ONE_TAKEN, propose("j", a("n1", 0), version=3), "rejected:would_exceed_capacity"
    ),
    Case(
        "fraction over what is left",
        pool(node("n1"), propose("o", a("n1", 0, milli=800), version=1)),
        propose("j", a("n1", 0, milli=300), version=2),
        "rejected:would_exceed_capacity",
    ),
    Case(
        "fraction on a MIG GPU",
        pool(node("n1"), propose("o", a("n1", 0, mig="1g.10gb"), version=1)),
        propose("j", a("n1", 0, milli=100), version=2),
        "rejected:would_exceed_capacity",
    ),
    Case("host CPU over the node's", TWO, propose("j", a("n1", 0), cpu=65_000), "rejected:would_exceed_capacity"),
    Case("requested more GPUs than a node has", TWO, request("j", "whole", gpus=3), "rejected:would_exceed_capacity"),
    Case("requested a model nobody has", TWO, request("j", "whole", gpu_model=L40S), "rejected:would_exceed_capacity"),
    Case("requested gang over the hosts", TWO, request("j", "gang", gpus=1, hosts=3), "rejected:would_exceed_capacity"),
    # node_not_ready
    Case(
        "cordoned node",
        pool(node("n1"), health(Cordoned, "n1", scope="node", reason="r")),
        propose("j", a("n1", 0)),
        "rejected:node_not_ready",
    ),
    Case(
        "draining node",
        pool(node("n1"), health(DrainRequested, "n1", reason="r")),
        propose("j", a("n1", 0)),
        "rejected:node_not_ready",
    ),
    Case(
        "failed node",
        pool(node("n1"), health(NodeFailed, "n1", reason="r")),
        propose("j", a("n1", 0)),
        "rejected:node_not_ready",
    ),
    Case(
        "failed GPU",
        pool(node("n1"), health(GpuFailed, "n1", gpu_index=0, reason="xid 79")),
        propose("j", a("n1", 0)),
        "rejected:node_not_ready",
    ),
    Case(
        "cordoned GPU",
        pool(node("n1"), health(Cordoned, "n1", scope="gpu", gpu_index=1, reason="r")),
        propose("j", a("n1", 1)),
        "rejected:node_not_ready",
    ),
    Case(
        "requested on a cordoned pool",
        pool(node("n1"), health(Cordoned, "n1", scope="node", reason="r")),
        request("j"),
        "rejected:node_not_ready",
    ),
    Case(
        "single-node work on a leaf-cordoned node",
        pool(node("n1"), health(Cordoned, "n1", scope="leaf", reason="r")),
        propose("j", a("n1", 0)),
        "granted:whole",
    ),
    Case(
        "a gang on a leaf-cordoned node",
        pool(node("n1"), node("n2"), health(Cordoned, "n2", scope="leaf", reason="r")),
        propose("j", a("n1", 0), a("n2", 0)),
        "rejected:node_not_ready",
    ),
    # over_quota
    Case("tenant over its quota", TENANT_QUOTA, propose("j", a("n1", 0), a("n1", 1), version=3), "rejected:over_quota"),
    Case("tenant within its quota", TENANT_QUOTA, propose("j", a("n1", 0), version=3), "granted:whole"),
    Case("queue over its quota", QUEUE_QUOTA, propose("j", a("n1", 0), version=3), "rejected:over_quota"),
    Case(
        "fraction within the queue quota",
        QUEUE_QUOTA,
        propose("j", a("n1", 0, milli=500), version=3),
        "granted:fraction",
    ),
    Case("requested over the tenant quota", TENANT_QUOTA, request("j", "whole", gpus=2), "rejected:over_quota"),
]
COARSE = {"coarse: node changed though the GPU is free"}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decision_table(case: Case) -> None:
    config = al.AllocatorConfig(fine_grained=False) if case.name in COARSE else al.DEFAULT_CONFIG
    before = copy.deepcopy(case.ledger)
    d = decide(case.ledger, case.command, config)
    assert outcome(d) == case.want, d
    assert case.ledger == before  # decide never changes the ledger
    for event in d.events:
        want = case.ledger.version + (0 if isinstance(event, AllocationRejected) else 1)
        assert event.ledger_version == want


def test_every_reject_reason_is_in_the_table() -> None:
    reasons = {c.want.split(":")[1] for c in CASES if c.want.startswith("rejected")}
    kinds = {c.want.split(":")[1] for c in CASES if c.want.startswith("granted")}
    assert reasons == {"stale", "conflict", "over_quota", "node_not_ready", "would_exceed_capacity", "invalid"}
    assert kinds == {"whole", "fraction", "mig", "gang", "remote"}


def run(ledger: Ledger, cmd: al.Input, now: dt.datetime = T0, log: list[LedgerEvent] | None = None) -> al.Decision:
    d = al.handle(ledger, cmd, now, hops=hops)
    if log is not None:
        log.extend(d.events)
    return d


def test_two_schedulers_on_one_gpu_one_wins_the_other_conflicts() -> None:
    ledger = pool(node("n1"), node("n2"))
    v = ledger.version
    first = run(ledger, propose("batch", a("n1", 0), a("n1", 1), version=v))
    second = run(ledger, propose("inference", a("n1", 1), version=v))
    assert outcome(first) == "granted:whole"
    assert second.rejection is not None and second.rejection.reason == "conflict"
    retry = run(ledger, propose("inference", a("n2", 0), version=ledger.version, cmd_id="retry"))
    assert outcome(retry) == "granted:whole"


def test_two_schedulers_on_different_gpus_of_one_node_both_win() -> None:
    ledger = pool(node("n1"))
    v = ledger.version
    assert outcome(run(ledger, propose("a", a("n1", 0), version=v))) == "granted:whole"
    assert outcome(run(ledger, propose("b", a("n1", 1), version=v))) == "granted:whole"


def test_a_gang_is_one_version_with_one_event_per_node() -> None:
    ledger = pool(node("n1"), node("n2"), node("n3"))
    d = run(ledger, request("g", "gang", gpus=2, hosts=3))
    assert [g.node_id for g in d.granted] == ["n1", "n2", "n3"]
    assert {g.ledger_version for g in d.granted} == {ledger.version}
    assert all(g.nodes == ["n1", "n2", "n3"] and g.allocation_id == "cmd-g" for g in d.granted)
    assert all({x.node_id for x in e.assignments} == {e.node_id} and len(e.assignments) == 2 for e in d.granted)


def test_a_proposed_gang_keeps_its_rank_order_in_every_grant() -> None:
    ledger = pool(node("n1"), node("n2"), node("n3"))
    d = run(ledger, propose("g", a("n3", 0), a("n1", 0), a("n2", 0), version=ledger.version, cmd_id="cmd-g"))
    assert [g.node_id for g in d.granted] == ["n3", "n1", "n2"]
    assert all(g.nodes == ["n3", "n1", "n2"] for g in d.granted)


def test_repeated_command_gets_the_same_answer_and_one_grant() -> None:
    ledger = pool(node("n1"))
    cmd = propose("j", a("n1", 0), version=1)
    first = run(ledger, cmd)
    version = ledger.version
    again = run(ledger, cmd)
    assert again.repeat and again.events == first.events and ledger.version == version
    assert list(ledger.allocations) == ["cmd-j"]
    run(ledger, ReleaseAllocation(source="s", key="cmd-j", allocation_id="cmd-j"))
    late = run(ledger, cmd)
    assert late.repeat and late.events == first.events and not ledger.allocations


def test_repeated_rejection_stays_a_rejection_after_room_appears() -> None:
    ledger = pool(node("n1"), propose("o", a("n1", 0), a("n1", 1), version=1))
    cmd = request("j", "whole")
    first = run(ledger, cmd)
    run(ledger, ReleaseAllocation(source="s", key="cmd-o", allocation_id="cmd-o"))
    again = run(ledger, cmd)
    assert again.repeat and again.events == first.events and outcome(again) == "rejected:would_exceed_capacity"


def test_release_twice_is_one_release() -> None:
    ledger = pool(node("n1"), node("n2"), request("g", "gang", gpus=1, hosts=2))
    release = ReleaseAllocation(source="s", key="cmd-g", allocation_id="cmd-g")
    first = run(ledger, release)
    assert [type(e) for e in first.events] == [AllocationReleased, AllocationReleased]
    again = run(ledger, release)
    assert again.repeat and again.events == first.events
    assert run(ledger, ReleaseAllocation(source="s", key="nope", allocation_id="nope")).note == "no allocation nope"
    assert all(g.granted_milli == 0 and not g.holders for n in ledger.nodes.values() for g in n.gpus)


def test_event_ids_derive_from_the_command() -> None:
    ledger = pool(node("n1"))
    one, two = (decide(ledger, propose("j", a("n1", 0), version=1)) for _ in range(2))
    assert one.events == two.events
    assert one.events[0].id[14] == "7"  # a UUIDv7
    other = decide(ledger, propose("j", a("n1", 0), version=1, cmd_id="other"))
    assert other.events[0].id != one.events[0].id


def test_lease_expires_at_its_time_and_not_before() -> None:
    ledger = pool(node("n1"), propose("j", a("n1", 0), version=1, lease_s=60))
    assert al.expire(ledger, T0 + dt.timedelta(seconds=59.9)).events == ()
    d = al.expire(ledger, T0 + dt.timedelta(seconds=60))
    assert [(type(e), getattr(e, "allocation_id", None)) for e in d.events] == [(AllocationExpired, "cmd-j")]
    apply(ledger, d.events)
    assert not ledger.allocations and ledger.nodes["n1"].gpus[0].fits_whole()


def test_renewal_extends_and_never_shortens() -> None:
    ledger = pool(node("n1"), propose("j", a("n1", 0), version=1, lease_s=60))
    now = T0 + dt.timedelta(seconds=30)
    d = run(ledger, RenewLease(id="r1", source="s", key="cmd-j", allocation_id="cmd-j", holder="j", extend_s=120), now)
    assert ledger.allocations["cmd-j"].lease_expires_at == now + dt.timedelta(seconds=120)
    assert run(ledger, RenewLease(id="r1", source="s", key="cmd-j", allocation_id="cmd-j", holder="j"), now).repeat
    assert d.events[0].ledger_version == ledger.version
    run(ledger, RenewLease(id="r2", source="s", key="cmd-j", allocation_id="cmd-j", holder="j", extend_s=1), now)
    assert ledger.allocations["cmd-j"].lease_expires_at == now + dt.timedelta(seconds=120)


@pytest.mark.parametrize(
    ("holder", "at", "why"),
    [("someone", 30, "does not hold"), ("j", 60, "ran out"), ("j", 61, "ran out")],
)
def test_renewal_refused(holder: str, at: float, why: str) -> None:
    ledger = pool(node("n1"), propose("j", a("n1", 0), version=1, lease_s=60))
    renew = RenewLease(id="r", source="s", key="cmd-j", allocation_id="cmd-j", holder=holder)
    d = decide_at(ledger, renew, T0 + dt.timedelta(seconds=at))
    assert d.rejection is not None and d.rejection.reason == "invalid" and why in d.rejection.detail


def decide_at(ledger: Ledger, cmd: al.Input, now: dt.datetime) -> al.Decision:
    return al.decide(ledger, cmd, now, hops=hops)


def test_node_failure_revokes_a_gang_on_every_node_and_only_what_it_touches() -> None:
    ledger = pool(
        node("n1"),
        node("n2"),
        node("n3"),
        request("gang", "gang", gpus=1, hosts=2),  # n1, n2
        propose("solo", a("n3", 0), version=3),
        propose("remote", a("n3", 1), version=4, client="n1"),
    )
    d = run(ledger, health(NodeFailed, "n2", reason="xid 79"))
    revoked = [(e.allocation_id, e.node_id) for e in d.events if isinstance(e, AllocationRevoked)]
    assert revoked == [("cmd-gang", "n1"), ("cmd-gang", "n2")]
    assert all("n2 failed: xid 79" in e.reason for e in d.events if isinstance(e, AllocationRevoked))
    assert sorted(ledger.allocations) == ["cmd-remote", "cmd-solo"] and ledger.nodes["n2"].state == "failed"
    d = run(ledger, health(NodeFailed, "n1", reason="gone"))  # the remote allocation's client
    assert [e.allocation_id for e in d.events if isinstance(e, AllocationRevoked)] == ["cmd-remote"]
    assert run(ledger, health(NodeFailed, "n1", reason="gone")).events == ()


def test_gpu_failure_revokes_its_holders_only() -> None:
    ledger = pool(node("n1"), propose("a", a("n1", 0, 500), version=1), propose("b", a("n1", 1), version=2))
    d = run(ledger, health(GpuFailed, "n1", gpu_index=0, reason="ecc"))
    assert [e.allocation_id for e in d.events if isinstance(e, AllocationRevoked)] == ["cmd-a"]
    assert list(ledger.allocations) == ["cmd-b"] and ledger.nodes["n1"].gpus[0].failed


def test_cordon_drain_and_recovery_change_state_without_revoking() -> None:
    ledger = pool(node("n1"), propose("j", a("n1", 0), version=1))
    for news, state in [
        (health(Cordoned, "n1", scope="node", reason="maintenance"), "cordoned"),
        (health(DrainRequested, "n1", reason="reboot"), "draining"),
        (health(Uncordoned, "n1", scope="node"), "ready"),
        (health(NodeFailed, "n1", reason="down"), "failed"),
        (health(NodeRecovered, "n1"), "ready"),
    ]:
        d = run(ledger, news)
        assert ledger.nodes["n1"].state == state
        assert isinstance(d.events[-1], PoolNodeUpdated)
    assert not ledger.allocations  # only the failure revoked
    assert run(ledger, health(Cordoned, "n1", scope="rail", rail=0, reason="r")).events == ()


def test_registering_again_keeps_state_unless_the_hardware_changed() -> None:
    ledger = pool(node("n1"), propose("j", a("n1", 1), version=1), health(GpuFailed, "n1", gpu_index=0, reason="x"))
    assert run(ledger, node("n1")).events == ()
    assert ledger.nodes["n1"].gpus[0].failed and "cmd-j" in ledger.allocations
    d = run(ledger, node("n1", uuid_tag="-new"))
    assert [type(e) for e in d.events] == [AllocationRevoked, PoolNodeUpdated]
    assert not ledger.nodes["n1"].gpus[0].failed and not ledger.allocations


def test_deregistered_node_leaves_with_its_allocations() -> None:
    ledger = pool(node("n1"), node("n2"), request("g", "gang", gpus=1, hosts=2))
    d = run(ledger, health(NodeDeregistered, "n2", reason="decommissioned"))
    assert [type(e) for e in d.events] == [AllocationRevoked, AllocationRevoked, PoolNodeUpdated]
    assert "n2" not in ledger.nodes and not ledger.allocations and ledger.removed_nodes == {"n2": ledger.version}


def test_mig_fills_a_gpu_with_valid_layouts_then_refuses() -> None:
    ledger = pool(node("n1", gpus=1))
    for i in range(7):
        assert outcome(run(ledger, request(f"m{i}", "mig", mig_profile="1g.10gb"))) == "granted:mig"
    gpu = ledger.nodes["n1"].gpus[0]
    assert is_valid(H100, list(gpu.mig)) and len(gpu.mig) == 7 and gpu.granted_milli == 7 * 142
    assert outcome(run(ledger, request("m8", "mig", mig_profile="1g.10gb"))) == "rejected:would_exceed_capacity"
    assert outcome(run(ledger, request("f", "fraction", milli=1))) == "rejected:would_exceed_capacity"


def test_released_mig_instance_frees_its_slices() -> None:
    ledger = pool(node("n1", gpus=1), request("a", "mig", mig_profile="4g.40gb"))
    assert outcome(decide(ledger, request("b", "mig", mig_profile="4g.40gb"))) == "rejected:would_exceed_capacity"
    run(ledger, ReleaseAllocation(source="s", key="cmd-a", allocation_id="cmd-a"))
    assert ledger.nodes["n1"].gpus[0].mig == () and ledger.nodes["n1"].gpus[0].fits_whole()
    assert outcome(run(ledger, request("b", "mig", mig_profile="7g.80gb"))) == "granted:mig"


def test_enforcement_of_a_fraction() -> None:
    ledger = pool(node("n1"))
    [grant] = decide(ledger, propose("j", a("n1", 1, milli=333, memory=12_000), version=1)).granted
    assert grant.enforcement.env == {
        "CUDA_VISIBLE_DEVICES": "GPU-n1-1",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "33",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=12000M",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "12000m",
        "CUDA_DEVICE_SM_LIMIT": "33",
    }
    assert grant.enforcement.visible_devices == ["GPU-n1-1"] and grant.enforcement.memory_limit_mib == 12_000


def test_enforcement_of_whole_gpus_and_mig() -> None:
    ledger = pool(node("n1", gpus=4))
    [whole] = decide(ledger, propose("j", a("n1", 3), a("n1", 1), version=1)).granted
    assert whole.enforcement.env == {"CUDA_VISIBLE_DEVICES": "GPU-n1-1,GPU-n1-3"}
    assert whole.enforcement.visible_devices == ["GPU-n1-1", "GPU-n1-3"]
    assert whole.enforcement.memory_limit_mib == 2 * H100_MIB
    [inst] = decide(ledger, propose("m", a("n1", 2, mig="3g.40gb"), version=1)).granted
    assert inst.enforcement.mig_instances == ["2:3g.40gb@0"] and inst.enforcement.env == {}
    assert parse_mig_instance("2:3g.40gb@0") == (2, MigInstance(profile="3g.40gb", start=0))
    assert inst.assignments == [a("n1", 2, milli=428, memory=40776, mig="3g.40gb")]


def test_enforcement_percentage_is_at_least_one() -> None:
    e = enforcement_for([DeviceShare(index=0, uuid="GPU-x", milli=5, memory_mib=10)])
    assert e.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"


def test_the_simulated_agent_enforces_a_fraction_memory_limit() -> None:
    ledger = pool(node("n1"))
    cmd = propose("j", a("n1", 0, milli=250, memory=10_000), version=1)
    cmd = msgspec.structs.replace(cmd, workload=WorkloadSpec(simulated_runtime_s=60, simulated_memory_mib=12_000))
    [grant] = decide(ledger, cmd).granted
    d = workload.admit_grant(grant, hosted_nodes={"n1": 2}, running=set(), now=T0, source="agent", default_runtime_s=1)
    assert isinstance(d, workload.GrantAdmitted) and d.workload.planned_exit == "oom"


def test_remote_grant_records_client_endpoint_and_distance() -> None:
    ledger = pool(node("n1"), node("n2"))
    [grant] = decide(ledger, request("j", "remote", gpus=2, client="n3")).granted
    assert (grant.node_id, grant.client_node_id, grant.hops) == ("n1", "n3", 2)
    assert grant.endpoint == "http://n1.example:9400"
    assert ledger.version == 2
    apply(ledger, [grant])
    assert ledger.allocations["cmd-j"].hops == 2


def test_placer_sees_only_candidates_and_a_bad_answer_is_not_committed() -> None:
    ledger = pool(node("n1"), node("n2"), health(Cordoned, "n1", scope="node", reason="r"))
    seen: list[PlacementRequest] = []

    def greedy(view: Ledger, want: PlacementRequest) -> list[GpuAssignment] | None:
        seen.append(want)
        return [a("n1", 0)]  # not a candidate: n1 is cordoned

    d = al.decide(ledger, request("j"), T0, place=greedy)
    assert seen[0].nodes == ("n2",)
    assert d.rejection is not None and d.rejection.reason == "invalid" and "not candidates" in d.rejection.detail


def test_over_quota_model_is_skipped_for_one_with_room() -> None:
    a100 = "NVIDIA A100-SXM4-80GB"
    ledger = pool(node("n1"), node("a1", model=a100, memory=81920), quota("t1", 0))
    [grant] = decide(ledger, request("j", "whole")).granted
    assert grant.node_id == "a1"


def test_quota_borrowing_within_a_cohort() -> None:
    ledger = pool(
        node("n1", gpus=4),
        quota("t1", 1000, cohort="c"),
        quota("t2", 2000, cohort="c"),
    )
    assert outcome(run(ledger, request("a", "whole", gpus=2, tenant="t1"))) == "granted:whole"  # borrows 1000
    assert outcome(run(ledger, request("b", "whole", gpus=2, tenant="t1"))) == "rejected:over_quota"
    assert outcome(run(ledger, request("c", "whole", gpus=1, tenant="t2"))) == "granted:whole"  # within nominal
    assert ledger.usage[("tenant", "t1", H100)] == Share(milli=2000, memory_mib=2 * H100_MIB)


def test_rebuild_from_the_encoded_stream_equals_the_ledger() -> None:
    log: list[LedgerEvent] = []
    ledger = Ledger()
    inputs: list[al.Input] = [
        node("n1", gpus=4),
        node("n2", gpus=4),
        node("n3", gpus=4),
        quota("t1", 8000, cohort="c"),
        propose("w", a("n1", 0), version=4),
        propose("f", a("n1", 1, milli=400), version=4),
        request("m", "mig", mig_profile="2g.20gb"),
        request("g", "gang", gpus=2, hosts=2),
        request("r", "remote", client="n3"),
        request("over", "whole", gpus=4),
        RenewLease(id="renew", source="s", key="cmd-w", allocation_id="cmd-w", holder="w", extend_s=900),
        ReleaseAllocation(source="s", key="cmd-f", allocation_id="cmd-f"),
        health(GpuFailed, "n2", gpu_index=0, reason="ecc"),
        health(Cordoned, "n1", scope="node", reason="r"),
        node("n1", gpus=3),
    ]
    for cmd in inputs:
        run(ledger, cmd, log=log)
    expired = al.expire(ledger, T0 + dt.timedelta(seconds=300)).events
    log.extend(expired)
    apply(ledger, expired)
    encoded = msgspec.json.encode(log)
    replayed = rebuild(msgspec.json.decode(encoded, type=list[LedgerEvent]))
    assert replayed == ledger
    assert rebuild(log + log) == ledger  # a redelivered stream changes nothing
    kinds = {e.kind for e in log if isinstance(e, AllocationGranted)}
    assert kinds == {"whole", "fraction", "mig", "gang", "remote"}
    ended = {type(e).__name__ for e in log if isinstance(e, AllocationReleased | AllocationRevoked | AllocationExpired)}
    assert ended == {"AllocationReleased", "AllocationRevoked", "AllocationExpired"}
    assert list(ledger.allocations) == ["cmd-w"] and isinstance(ledger.answer("cmd-over")[0], AllocationRejected)


def test_a_snapshot_and_the_events_after_it_give_the_ledger_of_the_whole_log() -> None:
    # A replica started after the pool stream dropped its first events loads the allocator's
    # snapshot and replays from a stream position at or before the first event of a later version:
    # the events of the snapshot's version or older it meets again change nothing.
    log: list[LedgerEvent] = []
    ledger = Ledger()
    for cmd in (node("n1", gpus=4), node("n2", gpus=4), quota("t1", 8000), request("g", "gang", gpus=2, hosts=2)):
        run(ledger, cmd, log=log)
    taken = len(log)
    kept = ledger_mod.without_past(ledger)  # a replica's: of the past, only what is held
    assert set(kept.answers) == {"cmd-g"} < set(ledger.answers) and kept.past_kept == 0
    snapshot = ledger_mod.LedgerSnapshot(
        version=ledger.version, stream_seq=taken + 1, ledger=ledger_mod.encode_ledger(kept)
    )
    for cmd in (
        propose("w", a("n1", 2), version=ledger.version),
        request("over", "whole", gpus=8),
        ReleaseAllocation(source="s", key="cmd-g", allocation_id="cmd-g"),
        health(GpuFailed, "n2", gpu_index=3, reason="ecc"),
    ):
        run(ledger, cmd, log=log)
    loaded = ledger_mod.decode_snapshot(ledger_mod.encode_snapshot(snapshot))
    replica = ledger_mod.decode_ledger(loaded.ledger)
    assert loaded.version == replica.version == log[taken - 1].ledger_version
    apply(replica, log[taken - 2 :])  # two events of the snapshot's version met again
    assert replica.nodes == ledger.nodes and replica.allocations == ledger.allocations
    assert replica.quotas == ledger.quotas and replica.usage == ledger.usage and replica.version == ledger.version
    assert replica.past_kept == 0
    # The allocator's own restart keeps its past as well: the answers repeated commands get.
    restarted = ledger_mod.decode_ledger(ledger_mod.encode_ledger(ledger))
    assert restarted == ledger and restarted.answer("cmd-over") == ledger.answer("cmd-over")


@pytest.mark.parametrize("data", [b"", b"\x93\x01", msgspec.msgpack.encode({"version": "x"})])
def test_a_damaged_snapshot_is_a_clear_error(data: bytes) -> None:
    with pytest.raises(ValueError, match="not an encoded ledger snapshot"):
        ledger_mod.decode_snapshot(data)
    with pytest.raises(ValueError, match="not an encoded ledger"):
        ledger_mod.decode_ledger(data)


def test_a_snapshot_names_its_ledger_format_and_one_of_another_format_is_refused() -> None:
    ledger = pool(node("n1"))
    snapshot = ledger_mod.LedgerSnapshot(version=ledger.version, stream_seq=1, ledger=ledger_mod.encode_ledger(ledger))
    assert ledger_mod.decode_snapshot(ledger_mod.encode_snapshot(snapshot)).format == ledger_mod.LEDGER_FORMAT
    # Written before snapshots carried the field: format 1.
    older = msgspec.msgpack.encode({"version": ledger.version, "stream_seq": 1, "ledger": snapshot.ledger})
    assert ledger_mod.decode_snapshot(older).format == 1
    newer = ledger_mod.encode_snapshot(msgspec.structs.replace(snapshot, format=ledger_mod.LEDGER_FORMAT + 1))
    with pytest.raises(ValueError, match=rf"ledger format {ledger_mod.LEDGER_FORMAT + 1}; this version reads format"):
        ledger_mod.decode_snapshot(newer)


def test_events_round_trip_through_the_bus_codec() -> None:
    from ibpool_proto import codec

    ledger = pool(node("n1"))
    [grant] = decide(ledger, request("j", "fraction", milli=500)).granted
    assert codec.decode(codec.encode(grant)) == grant


def test_a_missed_event_is_a_gap() -> None:
    log: list[LedgerEvent] = []
    ledger = Ledger()
    for cmd in (node("n1"), node("n2"), node("n3")):
        run(ledger, cmd, log=log)
    with pytest.raises(LedgerGap):
        rebuild([log[0], log[2]])


def test_the_answers_of_the_past_are_bounded_but_never_those_of_a_held_allocation() -> None:
    # A long-running ledger must not keep every answer it ever gave (memory, and the garbage
    # collector's passes over them): past `past_kept` (plus the slack that makes forgetting cheap)
    # the oldest answers and end events go, except those of allocations still held.
    log: list[LedgerEvent] = []
    ledger = Ledger(past_kept=10)
    for cmd in (node("n1"), propose("held", a("n1", 0), version=1)):
        run(ledger, cmd, log=log)
    for i in range(1_500):
        assert outcome(run(ledger, propose(f"j{i}", a("n1", 1), version=ledger.version), log=log)) == "granted:whole"
        run(ledger, ReleaseAllocation(source="s", key=f"cmd-j{i}", allocation_id=f"cmd-j{i}"), log=log)
    assert list(ledger.allocations) == ["cmd-held"]
    assert 11 <= len(ledger.answers) <= 1 + 10 + 1_000 and 10 <= len(ledger.ended) <= 1 + 10 + 1_000
    assert "cmd-held" in ledger.answers  # the oldest answer, kept while its allocation is held
    assert "cmd-j0" not in ledger.answers and "cmd-j0" not in ledger.ended
    # The newest are still answered as before: the same events, marked as a repeat.
    again = decide(ledger, propose("j1499", a("n1", 1), version=ledger.version))
    granted = tuple(e for e in log if isinstance(e, AllocationGranted) and e.allocation_id == "cmd-j1499")
    assert again.repeat and len(granted) == 1 and again.events == granted
    release = decide(ledger, ReleaseAllocation(source="s", key="cmd-j1499", allocation_id="cmd-j1499"))
    released = tuple(e for e in log if isinstance(e, AllocationReleased) and e.allocation_id == "cmd-j1499")
    assert release.repeat and len(released) == 1 and release.events == released
    # Forgetting is part of folding each event: one by one or all at once gives the same ledger.
    one_by_one, all_at_once = Ledger(past_kept=10), Ledger(past_kept=10)
    for e in log:
        apply(one_by_one, [e])
    apply(all_at_once, log)
    assert one_by_one == all_at_once == ledger
    # A replica keeps none of the past, only the answers of what is held.
    replica = Ledger(past_kept=0)
    apply(replica, log)
    assert len(replica.answers) <= 1 + 1_000 and "cmd-held" in replica.answers
    assert replica.allocations == ledger.allocations and replica.nodes == ledger.nodes
