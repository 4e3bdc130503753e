"""The naive baseline: the median (and 90th percentile) runtime of the tenant's finished jobs.

It is what the learned model must beat on the traces, and what the learned estimator serves before
its first model exists. A tenant with no finished job gets the pool-wide figures; an empty pool gets
`default_runtime_s`.
"""

from __future__ import annotations

import bisect
import math

from .contract import JobFeaturesLike, RuntimeEstimate


def _quantile(sorted_values: list[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics (numpy's default rule)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class NaiveMedianEstimator:
    """Per-tenant median and p90 of every runtime observed so far (a RuntimeEstimator).

    Keeps each tenant's runtimes sorted (bisect insertion), so predict is O(1) and observe O(n) memmove.
    """

    def __init__(self, default_runtime_s: float = 3_600.0) -> None:
        self.default_runtime_s = default_runtime_s
        self._by_tenant: dict[str, list[float]] = {}
        self._all: list[float] = []

    def observe(self, job: JobFeaturesLike, runtime_s: float) -> None:
        value = max(runtime_s, 0.0)
        bisect.insort(self._by_tenant.setdefault(job.tenant, []), value)
        bisect.insort(self._all, value)

    def predict(self, job: JobFeaturesLike) -> RuntimeEstimate:
        values = self._by_tenant.get(job.tenant) or self._all
        if not values:
            return RuntimeEstimate(p50=self.default_runtime_s, p90=self.default_runtime_s)
        return RuntimeEstimate(p50=_quantile(values, 0.5), p90=_quantile(values, 0.9))
