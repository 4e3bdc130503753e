"""The pool's fragmentation as GET /v1/pool and /metrics show it."""

from __future__ import annotations

import time

from ibpool_core.pool.ledger import Ledger
from ibpool_core.pool.placement import GpuPlacer
from ibpool_core.pool.policy_placer import PolicyPlacer
from ibpool_core.pool.pool_fragmentation import PoolFragmentation, measure_fragmentation

# A measure that took 50 ms or more is reused until 10x its cost has passed: it runs on the event
# loop (it reads the live ledger), about 0.3 s per 10,000 GPUs here, so a large pool spends at most
# ~10% of the loop on it. Cheaper ones are measured again on every change.
_COST_FACTOR = 10.0
_SLOW_S = 0.05


def fragmentation_of(place: GpuPlacer, ledger: Ledger) -> PoolFragmentation:
    """Measured against the workload mix the packing placer learned (FGD's expected fragment), or
    the partial-free measure while it has seen no request, or when the placer learns no mix."""
    if isinstance(place, PolicyPlacer):
        return place.fragmentation(ledger)
    return measure_fragmentation(ledger)


class FragmentationReader:
    """`fragmentation_of` for one placer, measured again when the ledger or the learned mix changed
    (for a slow measure, once 10x its cost has passed since the last one)."""

    def __init__(self, place: GpuPlacer) -> None:
        self.place = place
        self._last: tuple[tuple[int, int], float, float, PoolFragmentation] | None = None  # key, at, cost, value

    def read(self, ledger: Ledger) -> PoolFragmentation:
        now = time.monotonic()
        key = (ledger.version, self.place.mix.version if isinstance(self.place, PolicyPlacer) else 0)
        last = self._last
        if last is not None and (last[0] == key or (last[2] >= _SLOW_S and now - last[1] < _COST_FACTOR * last[2])):
            return last[3]
        value = fragmentation_of(self.place, ledger)
        self._last = (key, now, time.monotonic() - now, value)
        return value
