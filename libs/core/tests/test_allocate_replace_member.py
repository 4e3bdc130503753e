"""ReplaceGangMember and the failure of one member of a gang that declared `replace`: the ledger change."""

from __future__ import annotations

import msgspec

from ibpool_core.pool import allocate as al
from ibpool_core.pool.ledger import Ledger, rebuild
from ibpool_core.pool.messages import AllocationGranted, LedgerEvent
from ibpool_proto.health import Cordoned, GpuFailed, NodeFailed
from ibpool_proto.pool import (
    AllocationExpired,
    AllocationRejected,
    AllocationReleased,
    AllocationRevoked,
    GpuAssignment,
    MemberFailure,
    ReleaseAllocation,
    ReplaceGangMember,
    WorkloadSpec,
)
from libs.core.tests.pool_builders import T0, a, health, hops, node, propose, quota

GANG = "cmd-g"


def gang_pool(on_member_failure: MemberFailure = "replace", *extra: al.Input) -> tuple[Ledger, list[LedgerEvent]]:
    """Nodes n1..n4 (2 GPUs each), a 2-host gang on n2, n1 (rank order) holding both GPUs of each."""
    ledger, log = Ledger(), []
    cmds: list[al.Input] = [node("n1"), node("n2"), node("n3"), node("n4"), *extra]
    for cmd in cmds:
        log += al.handle(ledger, cmd, T0, hops=hops).events
    gang = msgspec.structs.replace(
        propose("g", a("n2", 0), a("n2", 1), a("n1", 0), a("n1", 1), version=ledger.version),
        on_member_failure=on_member_failure,
        scheduler_group="s",
        fencing_term=3,
    )
    log += al.handle(ledger, gang, T0, hops=hops).events
    return ledger, log


def replace(
    ledger: Ledger,
    *assignments: GpuAssignment,
    failed: str = "n2",
    cmd_id: str = "rep-1",
    term: int | None = 3,
    version: int | None = None,
    allocation_id: str = GANG,
    job_id: str = "g",
) -> ReplaceGangMember:
    return ReplaceGangMember(
        id=cmd_id,
        source="scheduler",
        key=allocation_id,
        allocation_id=allocation_id,
        job_id=job_id,
        failed_node_id=failed,
        assignments=list(assignments),
        ledger_version=ledger.version if version is None else version,
        workload=WorkloadSpec(simulated_runtime_s=5),
        reason="node n2 failed",
        scheduler_group="s",
        fencing_term=term,
    )


def run(ledger: Ledger, cmd: al.Input, log: list[LedgerEvent] | None = None) -> al.Decision:
    d = al.handle(ledger, cmd, T0, hops=hops)
    if log is not None:
        log += d.events
    return d


def test_the_grant_records_the_declaration_and_the_rank_order() -> None:
    ledger, _ = gang_pool()
    alloc = ledger.allocations[GANG]
    assert alloc.replaceable and alloc.nodes == ("n2", "n1")


def test_a_node_failure_revokes_only_the_failed_member_of_a_replace_gang() -> None:
    ledger, _ = gang_pool()
    d = run(ledger, health(NodeFailed, "n2", reason="no heartbeat"))
    revoked = [e for e in d.events if isinstance(e, AllocationRevoked)]
    assert [(e.allocation_id, e.node_id) for e in revoked] == [(GANG, "n2")]
    alloc = ledger.allocations[GANG]
    assert alloc.held_nodes == ("n1",) and alloc.nodes == ("n2", "n1")
    assert all(not g.holders for g in ledger.nodes["n2"].gpus)
    assert all(g.holders == (GANG,) for g in ledger.nodes["n1"].gpus)


def test_a_gpu_failure_revokes_only_that_member_too() -> None:
    ledger, _ = gang_pool()
    d = run(ledger, health(GpuFailed, "n1", gpu_index=1, reason="xid 48"))
    assert [(e.node_id) for e in d.events if isinstance(e, AllocationRevoked)] == ["n1"]
    assert ledger.allocations[GANG].held_nodes == ("n2",)


def test_a_restart_gang_is_revoked_on_every_node_as_before() -> None:
    ledger, _ = gang_pool("restart")
    d = run(ledger, health(NodeFailed, "n2", reason="no heartbeat"))
    assert sorted(e.node_id for e in d.events if isinstance(e, AllocationRevoked)) == ["n1", "n2"]
    assert GANG not in ledger.allocations


def test_replacing_before_the_failure_is_known_revokes_the_member_and_grants_the_new_host_at_its_rank() -> None:
    ledger, log = gang_pool()
    before_n1 = ledger.nodes["n1"]
    d = run(ledger, replace(ledger, a("n3", 0), a("n3", 1)), log)
    assert [type(e).__name__ for e in d.events] == ["AllocationRevoked", "AllocationGranted"]
    revoked, granted = d.events
    assert isinstance(revoked, AllocationRevoked) and isinstance(granted, AllocationGranted)
    assert revoked.node_id == "n2" and revoked.allocation_id == GANG and "replaced by node n3" in revoked.reason
    assert (granted.allocation_id, granted.node_id, granted.replaces, granted.command_id) == (GANG, "n3", "n2", "rep-1")
    assert granted.nodes == ["n3", "n1"]  # rank 0 was n2's
    assert granted.kind == "gang" and granted.on_member_failure == "replace"
    assert granted.fencing_term == 3 and granted.workload == WorkloadSpec(simulated_runtime_s=5)
    assert revoked.ledger_version == granted.ledger_version == ledger.version
    alloc = ledger.allocations[GANG]
    assert alloc.nodes == ("n3", "n1") and alloc.held_nodes == ("n3", "n1")
    assert granted.lease_expires_at == alloc.lease_expires_at
    assert ledger.nodes["n1"] is before_n1, "the surviving member's node is not touched"
    assert rebuild(log) == ledger


def test_replacing_after_the_failure_grants_only() -> None:
    ledger, log = gang_pool()
    run(ledger, health(NodeFailed, "n2", reason="no heartbeat"), log)
    d = run(ledger, replace(ledger, a("n3", 0), a("n3", 1)), log)
    assert [type(e).__name__ for e in d.events] == ["AllocationGranted"]
    assert ledger.allocations[GANG].held_nodes == ("n3", "n1")
    assert rebuild(log) == ledger


def test_a_repeated_replacement_gets_the_same_answer_and_changes_nothing() -> None:
    ledger, _ = gang_pool()
    cmd = replace(ledger, a("n3", 0), a("n3", 1))
    first = run(ledger, cmd)
    version = ledger.version
    again = al.decide(ledger, cmd, T0, hops=hops)
    assert again.repeat and again.granted == first.granted and ledger.version == version


def test_release_and_expiry_end_every_member_held_now() -> None:
    ledger, _ = gang_pool()
    run(ledger, replace(ledger, a("n3", 0), a("n3", 1)))
    d = al.decide(ledger, ReleaseAllocation(source="s", key=GANG, allocation_id=GANG), T0, hops=hops)
    assert sorted(e.node_id for e in d.events if isinstance(e, AllocationReleased)) == ["n1", "n3"]
    run(ledger, health(NodeFailed, "n3", reason="again"))
    later = al.expire(ledger, max(x.lease_expires_at for x in ledger.allocations.values()))
    assert [e.node_id for e in later.events if isinstance(e, AllocationExpired)] == ["n1"]


def reason(d: al.Decision) -> str:
    rejection = d.rejection
    assert isinstance(rejection, AllocationRejected), d.events
    return f"{rejection.reason}: {rejection.detail}"


def test_refusals_with_their_reasons() -> None:
    ledger, _ = gang_pool()
    v = ledger.version
    cases = {
        "not live": replace(ledger, a("n3", 0), a("n3", 1), allocation_id="nope"),
        "other job": replace(ledger, a("n3", 0), a("n3", 1), job_id="h"),
        "not a member": replace(ledger, a("n3", 0), a("n3", 1), failed="n4"),
        "two nodes": replace(ledger, a("n3", 0), a("n4", 0)),
        "a member": replace(ledger, a("n1", 0), a("n1", 1)),
        "too few GPUs": replace(ledger, a("n3", 0)),
        "fraction": replace(ledger, a("n3", 0, milli=500), a("n3", 1)),
        "future": replace(ledger, a("n3", 0), a("n3", 1), version=v + 5),
        "fenced": replace(ledger, a("n3", 0), a("n3", 1), term=2),
        "unknown node": replace(ledger, a("n9", 0), a("n9", 1)),
    }
    got = {name: reason(al.decide(ledger, cmd, T0, hops=hops)) for name, cmd in cases.items()}
    assert got["not live"].startswith("invalid: allocation nope is not live")
    assert got["other job"].startswith("invalid: allocation cmd-g belongs to job g")
    assert got["not a member"] == "invalid: node n4 is not a member of allocation cmd-g"
    assert got["two nodes"].startswith("invalid: a replacement is one node")
    assert got["a member"].startswith("invalid: node n1 is already a member")
    assert got["too few GPUs"] == "invalid: a member of this gang holds 2 whole GPUs; the replacement names 1"
    assert got["fraction"] == "invalid: a fraction or MIG instance is one GPU share; whole GPUs do not go with it"
    assert got["future"].startswith("invalid: computed on version")
    assert got["fenced"].startswith("stale: fenced: term 2")
    assert got["unknown node"] == "invalid: unknown node n9"
    assert ledger.version == v, "no refusal changes the ledger"


def test_a_restart_gang_cannot_be_patched() -> None:
    ledger, _ = gang_pool("restart")
    got = reason(al.decide(ledger, replace(ledger, a("n3", 0), a("n3", 1)), T0, hops=hops))
    assert got == "invalid: allocation cmd-g is not a gang that declared on_member_failure replace"


def test_the_new_host_must_be_ready_free_and_not_leaf_cordoned() -> None:
    ledger, _ = gang_pool()
    cordon = Cordoned(source="f", key="n3", node_id="n3", scope="leaf", reason="uplink down")
    run(ledger, cordon)
    assert reason(al.decide(ledger, replace(ledger, a("n3", 0), a("n3", 1)), T0, hops=hops)).startswith(
        "node_not_ready: node n3 is leaf-cordoned"
    )
    since = ledger.version
    run(ledger, propose("other", a("n4", 0), version=since))
    stale_view = replace(ledger, a("n4", 0), a("n4", 1), version=since)
    assert reason(al.decide(ledger, stale_view, T0, hops=hops)).startswith("conflict: GPU 0 of node n4")


def test_quota_counts_only_what_the_new_member_adds() -> None:
    # The tenant's quota is exactly the gang's 4 GPUs: swapping a held member for a new one fits.
    ledger, _ = gang_pool("replace", quota("t1", 4000))
    d = run(ledger, replace(ledger, a("n3", 0), a("n3", 1)))
    assert d.rejection is None and len(d.granted) == 1
    # After the failure freed the member, the replacement brings usage back to the quota: still fits.
    ledger, _ = gang_pool("replace", quota("t1", 4000))
    run(ledger, health(NodeFailed, "n2", reason="x"))
    assert run(ledger, replace(ledger, a("n3", 0), a("n3", 1))).rejection is None


def test_a_replacement_after_the_lease_ran_out_is_refused() -> None:
    import datetime as dt

    ledger, _ = gang_pool()
    late = ledger.allocations[GANG].lease_expires_at + dt.timedelta(seconds=1)
    d = al.handle(ledger, replace(ledger, a("n3", 0), a("n3", 1)), late, hops=hops)
    (rejected,) = [e for e in d.events if isinstance(e, AllocationRejected)]
    assert rejected.reason == "invalid" and "lease" in rejected.detail
    assert "n3" not in ledger.allocations[GANG].nodes
