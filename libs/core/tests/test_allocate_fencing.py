"""Fencing of scheduler proposals: the ledger remembers the highest term granted per scheduler group."""

from __future__ import annotations

import msgspec
import pytest

from ibpool_core.pool import allocate as al
from ibpool_core.pool.ledger import Ledger, rebuild
from ibpool_core.pool.messages import LedgerEvent, ProposePlacement
from libs.core.tests.pool_builders import T0, a, node, pool, propose


def fenced(cmd: ProposePlacement, term: int | None, group: str = "batch") -> ProposePlacement:
    return msgspec.structs.replace(cmd, fencing_term=term, scheduler_group=group)


def test_grant_records_the_term_of_its_group() -> None:
    ledger = pool(node("n1"), fenced(propose("j1", a("n1", 0), version=1), 7))
    assert ledger.terms == {"batch": 7}
    grant = ledger.answer("cmd-j1")[0]
    assert isinstance(grant, al.AllocationGranted)
    assert (grant.scheduler_group, grant.fencing_term) == ("batch", 7)


@pytest.mark.parametrize(
    ("name", "term", "group", "want"),
    [
        ("lower term of the same group", 6, "batch", "stale"),
        ("same term", 7, "batch", None),
        ("higher term", 8, "batch", None),
        ("lower term of another group", 1, "inference", None),
        ("no term at all", None, "batch", None),
    ],
)
def test_proposal_against_the_newest_term(name: str, term: int | None, group: str, want: str | None) -> None:
    ledger = pool(node("n1"), fenced(propose("j1", a("n1", 0), version=1), 7))
    decision = al.decide(ledger, fenced(propose("j2", a("n1", 1), version=2), term, group), T0)
    rejection = decision.rejection
    assert (rejection.reason if rejection else None) == want, name
    if rejection is not None:
        assert "fenced: term 6" in rejection.detail and "below term 7" in rejection.detail


def test_fenced_before_any_other_check() -> None:
    # The deposed leader's proposal names a node that does not exist: still refused as fenced.
    ledger = pool(node("n1"), fenced(propose("j1", a("n1", 0), version=1), 7))
    rejection = al.decide(ledger, fenced(propose("j2", a("nowhere", 0), version=2), 3), T0).rejection
    assert rejection is not None and rejection.reason == "stale" and "fenced" in rejection.detail


def test_rejected_proposal_does_not_raise_the_term() -> None:
    # j2 (term 9) conflicts with j1 on GPU 0: the grant, not the proposal, moves the fence.
    ledger = pool(
        node("n1"),
        fenced(propose("j1", a("n1", 0), version=1), 7),
        fenced(propose("j2", a("n1", 0), version=1), 9),
    )
    assert ledger.terms == {"batch": 7}
    assert al.decide(ledger, fenced(propose("j3", a("n1", 1), version=2), 8), T0).rejection is None


def test_rebuilt_ledger_keeps_the_fence() -> None:
    ledger = Ledger()
    events: list[LedgerEvent] = []
    for cmd in (node("n1"), fenced(propose("j1", a("n1", 0), version=1), 4), fenced(propose("j2", a("n1", 1)), 5)):
        events.extend(al.handle(ledger, cmd, T0).events)
    assert rebuild(events).terms == ledger.terms == {"batch": 5}
