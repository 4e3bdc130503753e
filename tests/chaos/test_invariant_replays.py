"""The invariants' replays on hand-written event logs (no containers): a replaced gang member keeps one
live allocation; a second allocation while one share of the first is live is caught; the attacker's
checks catch an event that acted on it, a request the server answered, and a durable it changed."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec

from ibpool_proto.health import NodeFailed
from ibpool_proto.pool import AllocationGranted, AllocationReleased, AllocationRevoked, Enforcement, GpuAssignment

from .attack import ATTACK_TERM, MARK
from .invariants import (
    Durable,
    Recorded,
    attack_dead_lettered,
    attack_had_no_effect,
    attack_refused,
    capacity_from_stream,
    durables_kept,
    no_job_held_twice,
    subject_matches,
)

AT = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def granted(alloc: str, node: str, version: int, replaces: str | None = None) -> AllocationGranted:
    return AllocationGranted(
        source="t",
        key=node,
        allocation_id=alloc,
        job_id="j",
        node_id=node,
        kind="gang",
        assignments=[GpuAssignment(node_id=node, gpu_index=0)],
        enforcement=Enforcement(),
        lease_expires_at=AT,
        ledger_version=version,
        replaces=replaces,
    )


def revoked(alloc: str, node: str, version: int) -> AllocationRevoked:
    return AllocationRevoked(
        source="t", key=node, allocation_id=alloc, job_id="j", node_id=node, ledger_version=version, reason="x"
    )


def log(*events: Any) -> list[Recorded]:
    return [
        Recorded(seq=i, subject="ibpool.pool.allocation.x", headers={}, event=e, data=msgspec.json.encode(e))
        for i, e in enumerate(events)
    ]


def test_a_replaced_member_keeps_one_live_allocation() -> None:
    pool = log(granted("A", "n1", 1), granted("A", "n2", 1), revoked("A", "n2", 2), granted("A", "n3", 2, "n2"))
    assert no_job_held_twice(pool).held
    assert capacity_from_stream(pool).held


def test_a_second_allocation_while_a_member_of_the_first_holds_is_caught() -> None:
    pool = log(granted("A", "n1", 1), granted("A", "n2", 1), revoked("A", "n2", 2), granted("B", "n3", 3))
    verdict = no_job_held_twice(pool)
    assert not verdict.held and "B granted while ['A'] live" in verdict.detail


def test_a_share_granted_twice_is_caught() -> None:
    pool = log(granted("A", "n1", 1), granted("A", "n2", 1), granted("B", "n2", 2))
    assert not capacity_from_stream(pool).held


def released(alloc: str, reason: str = "done") -> AllocationReleased:
    return AllocationReleased(
        source="pool-allocator",
        key="n1",
        allocation_id=alloc,
        job_id="j",
        node_id="n1",
        ledger_version=3,
        reason=reason,
    )


def test_the_attack_checks_pass_a_clean_record_and_catch_each_effect() -> None:
    clean = log(granted("A", "n1", 1), released("A"))
    assert attack_had_no_effect(clean, MARK, ATTACK_TERM).held
    # The attacker's own messages in the record are not effects.
    forged = NodeFailed(source=MARK, key="n1", node_id="n1", reason=MARK)
    assert attack_had_no_effect(log(granted("A", "n1", 1), forged), MARK, ATTACK_TERM).held
    effects = {
        "a release for the attacker's reason": released("A", reason=MARK),
        "a node failed": NodeFailed(source="failover-controller", key="n1", node_id="n1", reason="x"),
        "work revoked": revoked("A", "n1", 2),
        "a grant on the attacker's term": msgspec.structs.replace(granted("B", "n2", 4), fencing_term=ATTACK_TERM),
    }
    for what, event in effects.items():
        assert not attack_had_no_effect(log(granted("A", "n1", 1), event), MARK, ATTACK_TERM).held, what


def test_the_attackers_report_and_the_dlq_are_checked() -> None:
    report: dict[str, Any] = {
        "published": [{"id": "m1", "subject": "s", "stored": True}, {"id": "m2", "subject": "h", "stored": False}],
        "publish_failed": [],
        "refused": {"delete": {"subject": "$JS.API.X", "outcome": "TimeoutError", "violation": True}},
        "snooped": {"_INBOX.>": {"received": 0, "violation": True}},
    }
    assert attack_refused(report, sent=2).held
    assert not attack_refused(report, sent=3).held  # a crafted message the server did not take
    answered = {
        **report,
        "refused": {"delete": {"subject": "$JS.API.X", "outcome": "answered: {}", "violation": False}},
    }
    assert not attack_refused(answered, sent=2).held
    snooped = {**report, "snooped": {"_INBOX.>": {"received": 4, "violation": False}}}
    assert not attack_refused(snooped, sent=2).held
    dead = Recorded(seq=1, subject="ibpool.dlq.c", headers={"ibpool-dlq-header-Nats-Msg-Id": "m1"}, event=None)
    reads = {"c": Durable("IBPOOL_NODE", ("ibpool.node.node.>",))}
    report["published"][0]["subject"] = "ibpool.node.node.registered.n1"
    assert attack_dead_lettered([dead], report, reads).held
    assert not attack_dead_lettered([], report, reads).held
    # A subject no durable reads is judged by its effects only; with nothing read, nothing is proven.
    assert not attack_dead_lettered([], report, {"c": Durable("IBPOOL_NODE", ("ibpool.node.telemetry.>",))}).held


def test_a_durable_deleted_or_re_filtered_is_caught() -> None:
    before = {
        "pool-allocator-commands": Durable("IBPOOL_POOL", ("ibpool.pool.allocation.request.*",)),
        "scheduler-jobs": Durable("IBPOOL_JOB", ("ibpool.job.>",)),
    }
    assert durables_kept(before, dict(before)).held
    assert not durables_kept(before, {"scheduler-jobs": before["scheduler-jobs"]}).held
    planted = Durable("IBPOOL_POOL", ("ibpool.pool.nothing.>",))
    assert not durables_kept(before, {**before, "pool-allocator-commands": planted}).held


def test_subjects_match_as_nats_matches_them() -> None:
    assert subject_matches("ibpool.node.*.*", "ibpool.node.node.registered")
    assert subject_matches("ibpool.node.>", "ibpool.node.node.registered.n1")
    assert not subject_matches("ibpool.node.>", "ibpool.node")
    assert not subject_matches("ibpool.node.*", "ibpool.node.node.registered")
    assert not subject_matches("ibpool.job.*", "ibpool.node.x")
