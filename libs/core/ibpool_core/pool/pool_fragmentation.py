"""How fragmented the pool is, per GPU model, read from the ledger.

Two measures; `PoolFragmentation.measure` says which one a result holds:

* "fgd": the expected fragment of FGD (`fragmentation.FragModel` with the paper's rules) for a
  workload mix: per node, the free GPU milli that the mix's task types are expected not to be
  able to use (weighted by their popularity), summed per GPU model;
* "partial_free": the free milli of partly granted GPUs (some but not all of their compute
  granted), which no whole-GPU request can use. Used when no mix is known (nothing requested yet)
  and when the ledger holds a state the packing view cannot show.

Only ready GPUs of ready nodes count: the others have nothing free to fragment. Every model of the
pool appears, with 0 when nothing of it is fragmented.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from .fragmentation import FragModel
from .ledger import WHOLE, Ledger
from .ledger_packing import pack_ledger
from .packing import PackRequest

Measure = Literal["fgd", "partial_free"]


class PoolFragmentation(msgspec.Struct, frozen=True, kw_only=True):
    """milli        per GPU model, the fragmented free GPU-milli (see `measure`)
    free_milli   per GPU model, the free GPU-milli of ready GPUs on ready nodes
    task_types   distinct task types of the mix measured against (0 for partial_free)"""

    measure: Measure
    milli: dict[str, int]
    free_milli: dict[str, int]
    task_types: int = 0


def measure_fragmentation(ledger: Ledger, types: Sequence[tuple[PackRequest, int]] = ()) -> PoolFragmentation:
    """FGD's expected fragment for the mix `types` ((task type, weight) pairs), or the partial-free
    measure when `types` is empty."""
    partial: dict[str, int] = {}
    free: dict[str, int] = {}
    ready: list[str] = []
    for node in ledger.nodes.values():
        for g in node.gpus:
            partial.setdefault(g.model, 0)
            free.setdefault(g.model, 0)
            if node.ready and g.ready:
                free[g.model] += g.free_milli
                if 0 < g.granted_milli < WHOLE:
                    partial[g.model] += g.free_milli
        if node.ready:
            ready.append(node.node_id)
    built = pack_ledger(ledger, ready, lambda g: g.ready) if types else None
    if built is None:
        # No mix yet, or no ready GPU, or a ledger state the packing view cannot show.
        return PoolFragmentation(measure="partial_free", milli=partial, free_milli=free)
    cluster, _ = built
    model = FragModel(cluster, types)
    expected = dict.fromkeys(partial, 0.0)
    for n, spec in enumerate(cluster.nodes):
        expected[spec.gpu_model] += model.node_fraction(cluster.state(n)) * WHOLE
    return PoolFragmentation(
        measure="fgd", milli={m: round(v) for m, v in expected.items()}, free_milli=free, task_types=len(types)
    )
