"""policy_placer: RequestAllocation placed by the packing policies through allocate.decide."""

from __future__ import annotations

import copy

import pytest

from ibpool_core.pool import allocate as al
from ibpool_core.pool.ledger import Ledger, apply
from ibpool_core.pool.policies import POLICIES
from ibpool_core.pool.policy_placer import policy_placer
from ibpool_proto.pool import GpuAssignment
from libs.core.tests.pool_builders import H100, L40S, T0, a, hops, node, pool, propose, request

TWO = pool(node("n1"), node("n2"))
MIXED = pool(node("n1"), node("n2"), node("l1", model=L40S, memory=46068))
# n1 GPU 0 holds half of it (someone else's fraction).
HALF_USED = pool(node("n1"), node("n2"), propose("other", a("n1", 0, milli=500, memory=20_000)))

CASES = [
    ("whole", TWO, request("j", "whole", gpus=2)),
    ("whole of a model", MIXED, request("j", "whole", gpu_model=L40S)),
    ("fraction", HALF_USED, request("j", "fraction", milli=250)),
    ("fraction with memory", HALF_USED, request("j", "fraction", milli=300, memory_mib=30_000)),
    ("mig", TWO, request("j", "mig", mig_profile="1g.10gb")),
    ("gang (first fit)", TWO, request("j", "gang", gpus=2, hosts=2)),
    ("remote (first fit)", TWO, request("j", "remote", milli=300, client="n3")),
]


def grants(ledger: Ledger, cmd: al.Input, name: str) -> list[tuple[str, int, int]]:
    d = al.decide(ledger, cmd, T0, place=policy_placer(name), hops=hops)
    assert d.rejection is None, d.rejection
    assert d.granted
    return [(g.node_id, x.gpu_index, x.milli) for g in d.granted for x in g.assignments]


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize(("label", "ledger", "cmd"), CASES, ids=[c[0] for c in CASES])
def test_every_policy_grants_valid_allocations(name: str, label: str, ledger: Ledger, cmd: al.Input) -> None:
    d = al.decide(ledger, cmd, T0, place=policy_placer(name), hops=hops)
    assert d.rejection is None, d.rejection
    assert d.granted
    after = copy.deepcopy(ledger)
    apply(after, d.events)
    for n in after.nodes.values():
        assert all(g.granted_milli <= 1000 and g.granted_memory_mib <= g.memory_mib for g in n.gpus)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_fills_the_pool_then_rejects(name: str) -> None:
    """Repeated fractions through one placer (its mix learns) never overcommit a GPU."""
    ledger = copy.deepcopy(pool(node("n1"), node("n2", model=L40S, memory=46068)))
    place = policy_placer(name)
    granted = 0
    for i in range(20):
        d = al.decide(ledger, request(f"j{i}", "fraction", milli=400), T0, place=place, hops=hops)
        if d.rejection is not None:
            break
        granted += 1
        apply(ledger, d.events)
    assert granted == 8  # 2 x 400 on each of 4 GPUs
    for n in ledger.nodes.values():
        assert all(g.granted_milli <= 1000 for g in n.gpus)


def test_best_fit_packs_worst_fit_spreads() -> None:
    cmd = request("j", "fraction", milli=250)
    assert grants(HALF_USED, cmd, "best-fit") == [("n1", 0, 250)]
    assert grants(HALF_USED, cmd, "worst-fit")[0][0] == "n2"


def test_the_model_is_respected() -> None:
    got = grants(MIXED, request("j", "whole", gpu_model=H100), "worst-fit")
    assert got[0][0] in {"n1", "n2"}


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match=r"unknown policy 'nope'; known: first-fit, best-fit, .*fgd\+"):
        policy_placer("nope")


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_covered_kinds_do_not_fall_back_to_first_fit(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ibpool_core.pool import policy_placer as module

    fell_back: list[str] = []
    real = module.first_fit

    def spy(view: Ledger, want: module.PlacementRequest) -> list[GpuAssignment] | None:
        fell_back.append(want.request.kind)
        return real(view, want)

    monkeypatch.setattr(module, "first_fit", spy)
    for _, ledger, cmd in CASES:
        grants(ledger, cmd, name)
    # Without a fabric a gang has no leaf groups to pack into: first fit places it.
    assert sorted(fell_back) == ["gang"]
