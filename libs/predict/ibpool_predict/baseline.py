"""The naive baseline: the median (and 90th percentile) runtime of the tenant's finished jobs.

It is what the learned model must beat on the traces, and what the learned estimator serves before
its first model exists. A tenant with no finished job gets the pool-wide figures; an empty pool gets
`default_runtime_s`.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

from .contract import JobFeaturesLike, RuntimeEstimate


class _Runtimes:
    """Runtimes kept sorted, and in arrival order so that the oldest can go first."""

    def __init__(self) -> None:
        self.sorted: list[float] = []
        self.arrived: deque[float] = deque()

    def add(self, value: float, window: int | None) -> None:
        bisect.insort(self.sorted, value)
        if window is None:
            return
        self.arrived.append(value)
        if len(self.arrived) > window:
            del self.sorted[bisect.bisect_left(self.sorted, self.arrived.popleft())]


def _quantile(sorted_values: list[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics (numpy's default rule)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class NaiveMedianEstimator:
    """Per-tenant median and p90 of the runtimes observed so far (a RuntimeEstimator): of all of them,
    or with `window` of the newest `window` per tenant and overall (a service runs for months).

    Keeps each tenant's runtimes sorted (bisect insertion), so predict is O(1) and observe O(n) memmove.
    """

    def __init__(self, default_runtime_s: float = 3_600.0, window: int | None = None) -> None:
        self.default_runtime_s = default_runtime_s
        self.window = window
        self._by_tenant: dict[str, _Runtimes] = {}
        self._all = _Runtimes()

    def observe(self, job: JobFeaturesLike, runtime_s: float) -> None:
        value = max(runtime_s, 0.0)
        self._by_tenant.setdefault(job.tenant, _Runtimes()).add(value, self.window)
        self._all.add(value, self.window)

    def predict(self, job: JobFeaturesLike) -> RuntimeEstimate:
        tenant = self._by_tenant.get(job.tenant)
        values = tenant.sorted if tenant is not None else self._all.sorted
        if not values:
            return RuntimeEstimate(p50=self.default_runtime_s, p90=self.default_runtime_s)
        return RuntimeEstimate(p50=_quantile(values, 0.5), p90=_quantile(values, 0.9))
