"""policy_placer: RequestAllocation placed by the packing policies through allocate.decide."""

from __future__ import annotations

import copy
import datetime as dt

import msgspec
import pytest

from ibpool_core.pool import allocate as al
from ibpool_core.pool.ledger import Ledger, apply
from ibpool_core.pool.messages import ProposePlacement, RequestAllocation
from ibpool_core.pool.policies import POLICIES
from ibpool_core.pool.policy_placer import policy_placer
from ibpool_proto.node import GpuInfo, NodeRegistered
from ibpool_proto.pool import GpuAssignment, ResourceRequest

# Ledgers built as in test_ledger.py.
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
H100 = "NVIDIA H100 80GB HBM3"
H100_MIB = 81559
L40S = "NVIDIA L40S"


def hops(a: str, b: str) -> int | None:
    return 0 if a == b else 2


def node(node_id: str, gpus: int = 2, model: str = H100, memory: int = H100_MIB) -> NodeRegistered:
    return NodeRegistered(
        source="agent",
        key=node_id,
        node_id=node_id,
        hostname=f"{node_id}.example",
        cpu_milli=64_000,
        memory_mib=512_000,
        backend="simulated",
        gpus=[
            GpuInfo(index=i, uuid=f"GPU-{node_id}-{i}", model=model, memory_mib=memory, mig_capable=model != L40S)
            for i in range(gpus)
        ],
        api_url=f"http://{node_id}.example:9400",
    )


def a(node_id: str, gpu: int, milli: int = 1000, memory: int | None = None) -> GpuAssignment:
    return GpuAssignment(node_id=node_id, gpu_index=gpu, milli=milli, memory_mib=memory)


def propose(job: str, *assignments: GpuAssignment, version: int = 2) -> ProposePlacement:
    return ProposePlacement(
        id=f"cmd-{job}",
        source="scheduler",
        key=job,
        job_id=job,
        tenant="t1",
        queue="q1",
        ledger_version=version,
        assignments=list(assignments),
        lease_s=300.0,
    )


def request(job: str, kind: str = "whole", *, client: str | None = None, **resources: object) -> RequestAllocation:
    return RequestAllocation(
        id=f"cmd-{job}",
        source="scheduler",
        key=job,
        job_id=job,
        tenant="t1",
        queue="q1",
        request=msgspec.convert({"kind": kind, **resources}, ResourceRequest),
        client_node_id=client,
    )


def pool(*inputs: al.Input) -> Ledger:
    ledger = Ledger()
    for cmd in inputs:
        al.handle(ledger, cmd, T0, hops=hops)
    return ledger


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
    assert sorted(fell_back) == ["gang", "remote"]
