"""The pool view's fragmentation and fabric fields."""

from __future__ import annotations

import datetime as dt

from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.view import FabricView, fabric_state
from ibpool_core.pool.allocate import handle
from ibpool_core.pool.ledger import Ledger
from ibpool_core.pool.policy_placer import policy_placer
from ibpool_pool_allocator.api import pool_view
from ibpool_pool_allocator.fragmentation_measure import FragmentationReader, fragmentation_of
from ibpool_proto.node import GpuInfo, NodeRegistered
from ibpool_proto.pool import RequestAllocation, ResourceRequest

SMALL = generate("fat_tree_2tier:hosts=8,radix=8")
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def registered(node_id: str) -> NodeRegistered:
    return NodeRegistered(
        source="t",
        key=node_id,
        node_id=node_id,
        hostname=node_id,
        cpu_milli=8000,
        memory_mib=64_000,
        gpus=[GpuInfo(index=i, uuid=f"{node_id}-{i}", model="H100", memory_mib=80_000) for i in range(2)],
        backend="test",
    )


def test_pool_view_says_which_fragmentation_it_shows() -> None:
    ledger = Ledger()
    handle(ledger, registered("node001"), NOW)
    place = policy_placer("best-fit")
    before = pool_view(ledger, fragmentation_of(place, ledger))
    assert before.fragmentation_measure == "partial_free" and before.fabric is None
    ask = RequestAllocation(
        source="t", key="j", job_id="j", tenant="t", queue="q", request=ResourceRequest(kind="fraction", milli=700)
    )
    handle(ledger, ask, NOW, place=place)
    view = FabricView(fabric_state(SMALL, version=None, origin="test"))
    after = pool_view(ledger, fragmentation_of(place, ledger), view.about)
    (model,) = after.models
    # A 700-milli mix cannot use the 300 left on the shared GPU.
    assert (after.fragmentation_measure, after.workload_types, model.fragmentation_milli) == ("fgd", 1, 300)
    assert after.fabric is not None and after.fabric.hosts == 8


def test_fragmentation_reader_measures_again_when_the_ledger_changes() -> None:
    ledger = Ledger()
    handle(ledger, registered("node001"), NOW)
    place = policy_placer("fgd")
    reader = FragmentationReader(place)
    assert reader.read(ledger).measure == "partial_free"
    ask = RequestAllocation(
        source="t", key="j", job_id="j", tenant="t", queue="q", request=ResourceRequest(kind="fraction", milli=600)
    )
    handle(ledger, ask, NOW, place=place)
    again = reader.read(ledger)
    assert (again.measure, again.milli) == ("fgd", {"H100": 400})
    assert reader.read(ledger) is again
