"""The invariants' replays on hand-written event logs (no containers): a replaced gang member keeps one
live allocation; a second allocation while one share of the first is live is caught."""

from __future__ import annotations

import datetime as dt
from typing import Any

from ibpool_proto.pool import AllocationGranted, AllocationRevoked, Enforcement, GpuAssignment

from .invariants import Recorded, capacity_from_stream, no_job_held_twice

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
    return [Recorded(seq=i, subject="ibpool.pool.allocation.x", headers={}, event=e) for i, e in enumerate(events)]


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
