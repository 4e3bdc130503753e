from typing import NamedTuple

import msgspec
import pytest

from ibpool_core.pool import allocate as al
from ibpool_core.pool.ledger import Ledger, rebuild
from ibpool_core.pool.messages import AllocationGranted, AllocationRejected, LedgerEvent, QuotaChanged, SetQuota
from ibpool_core.pool.quotas import Quota, QuotaKey, Share, cohort_of, problems, refusal, resolve_model

from .pool_builders import T0, hops, node, quota, request

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
BIG = 10**9  # memory that never limits, so the milli rule shows alone


def q(
    name: str,
    milli: int,
    memory: int = BIG,
    *,
    scope: str = "tenant",
    model: str = H100,
    cohort: str | None = None,
    borrow: int | None = None,
    lend: int | None = None,
) -> Quota:
    return Quota(
        scope="queue" if scope == "queue" else "tenant",
        name=name,
        gpu_model=model,
        nominal=Share(milli=milli, memory_mib=memory),
        borrowing_limit=None if borrow is None else Share(milli=borrow, memory_mib=BIG),
        lending_limit=None if lend is None else Share(milli=lend, memory_mib=BIG),
        cohort=cohort,
    )


def used(**by_tenant: int) -> dict[QuotaKey, Share]:
    return {("tenant", t, H100): Share(milli=m) for t, m in by_tenant.items()}


def milli(m: int) -> dict[str, Share]:
    return {H100: Share(milli=m)}


class Case(NamedTuple):
    name: str
    quotas: list[Quota]
    usage: dict[QuotaKey, Share]
    adds: dict[str, Share]
    want: str | None  # None: admitted; else a piece of the refusal


CASES = [
    Case("no quota, no limit", [], used(a=50_000), milli(8000), None),
    Case("within the nominal share", [q("a", 4000)], used(a=3000), milli(1000), None),
    Case("over the nominal, no cohort", [q("a", 4000)], used(a=3500), milli(1000), "no cohort"),
    Case("a fraction counts its milli", [q("a", 1000)], used(a=700), milli(300), None),
    Case("a fraction over by one milli", [q("a", 1000)], used(a=701), milli(300), "no cohort"),
    Case(
        "borrows an idle peer's share",
        [q("a", 2000, cohort="c"), q("b", 2000, cohort="c")],
        used(a=2000),
        milli(2000),
        None,
    ),
    Case(
        "cannot borrow what the peer uses",
        [q("a", 2000, cohort="c"), q("b", 2000, cohort="c")],
        used(a=2000, b=1500),
        milli(1000),
        "cannot lend",
    ),
    Case(
        "borrowing limit",
        [q("a", 2000, cohort="c", borrow=500), q("b", 8000, cohort="c")],
        used(a=2000),
        milli(1000),
        "borrowing limit",
    ),
    Case(
        "within the borrowing limit",
        [q("a", 2000, cohort="c", borrow=1000), q("b", 8000, cohort="c")],
        used(a=2000),
        milli(1000),
        None,
    ),
    Case(
        "lending limit keeps a reserve",
        [q("a", 0, cohort="c"), q("b", 4000, cohort="c", lend=1000)],
        used(),
        milli(2000),
        "cannot lend",
    ),
    Case(
        "lends up to its lending limit",
        [q("a", 0, cohort="c"), q("b", 4000, cohort="c", lend=1000)],
        used(),
        milli(1000),
        None,
    ),
    Case(
        "the reserve is used first by its owner",
        [q("a", 0, cohort="c"), q("b", 4000, cohort="c", lend=1000)],
        used(b=3000),
        milli(1000),
        None,
    ),
    Case(
        "past the reserve the owner's use is not lent",
        [q("a", 0, cohort="c"), q("b", 4000, cohort="c", lend=1000)],
        used(b=3500),
        milli(1000),
        "cannot lend",
    ),
    Case(
        "the guarantee holds while peers borrow it",
        [q("a", 2000, cohort="c"), q("b", 2000, cohort="c")],
        used(b=4000),
        milli(2000),
        None,
    ),
    Case(
        "another cohort lends nothing",
        [q("a", 1000, cohort="c"), q("b", 4000, cohort="d")],
        used(a=1000),
        milli(1000),
        "cannot lend",
    ),
    Case(
        "another model lends nothing",
        [q("a", 1000, cohort="c"), q("b", 4000, cohort="c", model=A100)],
        used(a=1000),
        milli(1000),
        "cannot lend",
    ),
    Case(
        "memory is checked on its own",
        [q("a", 8000, memory=100_000)],
        {},
        {H100: Share(milli=1000, memory_mib=100_001)},
        "MiB is over the nominal",
    ),
    Case("a quota of another model does not apply", [q("a", 0, model=A100)], {}, milli(1000), None),
    Case("the queue is checked too", [q("a", 8000), q("q", 500, scope="queue")], {}, milli(1000), "queue 'q'"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_admission_rule(case: Case) -> None:
    quotas = {x.key: x for x in case.quotas}
    why = refusal(quotas, case.usage, "a", "q", case.adds)
    if case.want is None:
        assert why is None
    else:
        assert why is not None and case.want in why, why


def test_limit_and_lendable() -> None:
    assert q("a", 1000).limit == Share(milli=1000, memory_mib=BIG)
    assert q("a", 1000, cohort="c").limit is None
    assert q("a", 1000, cohort="c", borrow=500).limit == Share(milli=1500, memory_mib=2 * BIG)
    assert q("a", 1000, lend=5000).lendable == Share(milli=1000, memory_mib=BIG)


def test_cohort_members_share_scope_cohort_and_model() -> None:
    a, b = q("a", 1, cohort="c"), q("b", 1, cohort="c")
    others = [q("x", 1, cohort="c", scope="queue"), q("y", 1, cohort="c", model=A100), q("z", 1)]
    assert cohort_of([a, b, *others], a) == [a, b]
    assert cohort_of([a, b], q("z", 1)) == [q("z", 1)]


def test_problems_of_a_quota() -> None:
    assert problems(q("a", 1000)) == []
    assert problems(q("a", -1)) == ["nominal must not be negative"]
    assert problems(q("", 1)) == ["a quota needs a name and a GPU model"]
    assert problems(q("a", 1, cohort="")) == ["the cohort, when given, must not be empty"]


def test_a_quota_names_its_gpu_model_as_the_pool_knows_it() -> None:
    known = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H200"]
    assert resolve_model("NVIDIA H100 80GB HBM3", known) == "NVIDIA H100 80GB HBM3"
    assert resolve_model("h100", known) == "NVIDIA H100 80GB HBM3"
    assert resolve_model("H100 80GB", known) == "NVIDIA H100 80GB HBM3"
    assert resolve_model("a100", known) == "NVIDIA A100-SXM4-80GB"
    assert resolve_model("A100 SXM4", known) == "NVIDIA A100-SXM4-80GB"
    assert resolve_model("B200", []) == "B200"  # nothing known yet: taken as given
    with pytest.raises(ValueError, match="ambiguous: it names NVIDIA H100 80GB HBM3, NVIDIA H200"):
        resolve_model("nvidia", ["NVIDIA H100 80GB HBM3", "NVIDIA H200"])
    with pytest.raises(ValueError, match="no GPU model 'B200' in the pool; it has NVIDIA A100"):
        resolve_model("B200", known)
    with pytest.raises(ValueError, match="no GPU model 'H10'"):
        resolve_model("H10", known)  # words, not letters


def test_a_removed_quota_no_longer_limits_and_the_replayed_stream_agrees() -> None:
    ledger = Ledger()
    events: list[LedgerEvent] = []
    for cmd in (node("n1", 4), quota("t", 1000)):
        events += al.handle(ledger, cmd, T0, hops=hops).events
    assert ("tenant", "t", H100) in ledger.quotas
    asked = request("j1", "whole", tenant="t", gpus=2)
    (refused,) = al.decide(ledger, asked, T0, hops=hops).events
    assert isinstance(refused, AllocationRejected) and "over the nominal 1000" in refused.detail
    gone = SetQuota(id="rm", source="api", key="t", quota=quota("t", 0).quota, remove=True)
    decision = al.handle(ledger, gone, T0, hops=hops)
    (removed,) = decision.events
    assert isinstance(removed, QuotaChanged) and removed.removed and removed.quota.nominal.milli == 1000
    events += decision.events
    assert ("tenant", "t", H100) not in ledger.quotas
    assert isinstance(al.decide(ledger, asked, T0, hops=hops).events[0], AllocationGranted)  # no longer limited
    again = al.decide(ledger, msgspec.structs.replace(gone, id="rm2"), T0, hops=hops)
    assert not again.events and again.note == f"no tenant quota of 't' on '{H100}' to remove"
    assert rebuild(events).quotas == ledger.quotas == {}
