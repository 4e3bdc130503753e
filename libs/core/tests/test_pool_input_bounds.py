"""Leases and host amounts are bounded in the core: a command from the bus with a lease that would
overflow a timestamp (or NaN, or infinite) is refused as invalid, never an exception."""

from __future__ import annotations

import math

import msgspec
import pytest

from ibpool_core.pool import allocate as al
from ibpool_proto.pool import RenewLease

from .pool_builders import T0, a, node, pool, propose, request


@pytest.mark.parametrize("lease_s", [0.0, -1.0, al.MAX_LEASE_S + 1, 1e16, math.inf, math.nan])
def test_a_lease_outside_the_bound_is_invalid(lease_s: float) -> None:
    ledger = pool(node("n1"))
    for cmd in (
        propose("j", a("n1", 0), lease_s=lease_s),
        msgspec.structs.replace(request("k", gpus=1), lease_s=lease_s),
    ):
        decision = al.decide(ledger, cmd, T0)
        assert decision.rejection is not None and decision.rejection.reason == "invalid", cmd
        assert "lease_s must be within" in decision.rejection.detail


def test_the_longest_lease_is_granted_and_a_renewal_is_bounded_too() -> None:
    ledger = pool(node("n1"))
    granted = al.handle(ledger, propose("j", a("n1", 0), lease_s=al.MAX_LEASE_S, version=ledger.version), T0)
    assert granted.rejection is None and granted.events
    for extend_s, ok in ((al.MAX_LEASE_S, True), (1e16, False), (math.nan, False), (0.0, False)):
        renew = RenewLease(source="s", key="cmd-j", allocation_id="cmd-j", holder="j", extend_s=extend_s)
        decision = al.decide(ledger, msgspec.structs.replace(renew, id=f"renew-{extend_s}"), T0)
        assert (decision.rejection is None) == ok, (extend_s, decision)


def test_host_amounts_are_bounded() -> None:
    ledger = pool(node("n1"))
    for cpu in (-1, al.MAX_CPU_MILLI + 1):
        decision = al.decide(ledger, propose("j", a("n1", 0), cpu=cpu), T0)
        assert decision.rejection is not None and decision.rejection.reason == "invalid"


def test_a_job_holds_one_live_allocation_unless_it_asks_for_another() -> None:
    ledger = pool(node("n1", gpus=4))
    first = al.handle(ledger, request("j", gpus=1, cmd_id="first"), T0)
    assert first.rejection is None and first.events
    again = al.handle(ledger, request("j", gpus=1, cmd_id="first"), T0)  # the same command: its answer
    assert again.repeat and again.rejection is None
    second = al.decide(ledger, request("j", gpus=1, cmd_id="second"), T0)
    assert second.rejection is not None and second.rejection.reason == "conflict"
    assert "already holds allocation first" in second.rejection.detail
    extra = al.handle(ledger, msgspec.structs.replace(request("j", gpus=1, cmd_id="extra"), additional=True), T0)
    assert extra.rejection is None and extra.events
    other_job = al.decide(ledger, request("k", gpus=1, cmd_id="k1"), T0)
    assert other_job.rejection is None


def test_an_id_answered_for_another_request_is_a_conflict_not_that_answer() -> None:
    ledger = pool(node("n1", gpus=4))
    assert al.handle(ledger, request("j", gpus=1, cmd_id="same"), T0).rejection is None
    assert al.decide(ledger, request("j", gpus=1, cmd_id="same"), T0).conflict == ""
    other_job = al.decide(ledger, request("k", gpus=1, cmd_id="same"), T0)
    assert other_job.repeat and "was used for job j, not k" in other_job.conflict
    other_tenant = al.decide(ledger, request("j", gpus=1, cmd_id="same", tenant="t9"), T0)
    assert other_tenant.repeat and "tenant/queue/kind t1/q1/whole, asked t9/q1/whole" in other_tenant.conflict
