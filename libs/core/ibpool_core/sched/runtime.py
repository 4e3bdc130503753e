"""The runtime-estimator contract the scheduler consumes, and a simple online estimator. Pure.

The learned model lives in `ibpool_predict` and matches this protocol structurally; the core only
needs `predict` at submit and `observe` at finish. `RecentMedianEstimator` is the fallback that makes
the simulator work without the learned model: the median (p50) and 90th percentile (p90) of the most
recent runtimes of the same tenant and GPU count, falling back to the tenant, then to every job.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import msgspec


class JobFeatures(msgspec.Struct, frozen=True):
    """What is known about a job when it is submitted: nothing here may depend on its outcome."""

    tenant: str  # the virtual cluster in Philly
    num_gpus: int
    submit_time: float  # POSIX seconds
    requested_limit_s: float | None = None
    name: str | None = None


class RuntimeEstimate(msgspec.Struct, frozen=True):
    """Predicted runtime quantiles in seconds; 0 <= p50 <= p90."""

    p50: float
    p90: float


class RuntimeEstimator(Protocol):
    def predict(self, job: JobFeatures) -> RuntimeEstimate:
        """Quantiles for a job about to be queued; never blocks on training."""
        ...

    def observe(self, job: JobFeatures, runtime_s: float) -> None:
        """Learn from a job that finished after running `runtime_s` seconds."""
        ...


def _quantiles(window: deque[float]) -> RuntimeEstimate:
    ordered = sorted(window)
    n = len(ordered)
    return RuntimeEstimate(p50=ordered[(n - 1) // 2], p90=ordered[min(n - 1, (9 * n) // 10)])


class RecentMedianEstimator:
    """Median and p90 of the last `window` runtimes per (tenant, GPUs), else per tenant, else global.

    A key is used once it has `min_samples` observations. With nothing observed at all it predicts
    `prior_s` for both quantiles. A requested limit, when given, caps the prediction (a job cannot run
    longer than its limit). Memory is bounded: one window per key seen.
    """

    def __init__(self, *, window: int = 32, min_samples: int = 3, prior_s: float = 3600.0) -> None:
        self._window = window
        self._min_samples = min_samples
        self._prior = RuntimeEstimate(p50=prior_s, p90=prior_s)
        self._by_tenant_gpus: dict[tuple[str, int], deque[float]] = {}
        self._by_tenant: dict[str, deque[float]] = {}
        self._everything: deque[float] = deque(maxlen=window * 8)
        self._cache: dict[object, RuntimeEstimate] = {}

    def _window_for(self, job: JobFeatures) -> tuple[object, deque[float]]:
        pair = self._by_tenant_gpus.get((job.tenant, job.num_gpus))
        if pair is not None and len(pair) >= self._min_samples:
            return (job.tenant, job.num_gpus), pair
        tenant = self._by_tenant.get(job.tenant)
        if tenant is not None and len(tenant) >= self._min_samples:
            return job.tenant, tenant
        return None, self._everything

    def predict(self, job: JobFeatures) -> RuntimeEstimate:
        key, window = self._window_for(job)
        if len(window) == 0:
            estimate = self._prior
        else:
            cached = self._cache.get(key)
            estimate = cached if cached is not None else self._cache.setdefault(key, _quantiles(window))
        limit = job.requested_limit_s
        if limit is not None and estimate.p90 > limit:
            estimate = RuntimeEstimate(p50=min(estimate.p50, limit), p90=limit)
        return estimate

    def observe(self, job: JobFeatures, runtime_s: float) -> None:
        pair_key = (job.tenant, job.num_gpus)
        self._by_tenant_gpus.setdefault(pair_key, deque(maxlen=self._window)).append(runtime_s)
        self._by_tenant.setdefault(job.tenant, deque(maxlen=self._window)).append(runtime_s)
        self._everything.append(runtime_s)
        for key in (pair_key, job.tenant, None):
            self._cache.pop(key, None)


class RuntimeHistory:
    """The learned runtime distribution: sorted recent runtimes per (tenant, GPUs), else tenant, else all.

    What a Gittins-index policy reads (`samples`): the last `window` runtimes of finished jobs of the
    same tenant (Philly: virtual cluster) and GPU count, once there are `min_samples` of them; else
    of the tenant; else of every job (empty until something finished). Only `observe` (a job that
    ended) changes it, so it never sees a runtime before the job finished. `version` counts the
    observations, for callers that cache what they derive from the samples.
    """

    def __init__(self, *, window: int = 256, min_samples: int = 8) -> None:
        if window < 1 or min_samples < 1:
            raise ValueError(f"window and min_samples must be >= 1, got {window} and {min_samples}")
        self._window = window
        self._min_samples = min_samples
        self._recent: dict[object, deque[float]] = {}
        self._sorted: dict[object, tuple[float, ...]] = {}
        self.version = 0

    def observe(self, job: JobFeatures, runtime_s: float) -> None:
        if runtime_s < 0 or runtime_s != runtime_s:
            raise ValueError(f"runtime of {job.tenant}/{job.num_gpus} GPUs must be >= 0, got {runtime_s}")
        for key in ((job.tenant, job.num_gpus), job.tenant, None):
            window = self._recent.get(key)
            if window is None:
                window = self._recent[key] = deque(maxlen=self._window if key is not None else self._window * 8)
            window.append(runtime_s)
            self._sorted.pop(key, None)
        self.version += 1

    def key_for(self, tenant: str, num_gpus: int) -> object:
        """The key whose samples describe such a job: (tenant, GPUs), tenant or None (everything)."""
        for key in ((tenant, num_gpus), tenant):
            window = self._recent.get(key)
            if window is not None and len(window) >= self._min_samples:
                return key
        return None

    def samples(self, tenant: str, num_gpus: int) -> tuple[float, ...]:
        """Sorted runtimes (seconds) of the most specific key with enough observations."""
        key = self.key_for(tenant, num_gpus)
        found = self._sorted.get(key)
        if found is None:
            found = self._sorted[key] = tuple(sorted(self._recent.get(key, ())))
        return found
