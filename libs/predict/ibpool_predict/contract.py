"""The runtime-estimator contract the scheduler consumes; the core owns it (`ibpool_core.sched.runtime`).

Re-exported here so this package's callers have one import place. The estimators here read a job
through `JobFeaturesLike` (the attributes only), so they accept the core's `JobFeatures` and any
structural match, and satisfy the core's `RuntimeEstimator` protocol.
"""

from __future__ import annotations

from typing import Protocol

from ibpool_core.sched.runtime import JobFeatures, RuntimeEstimate, RuntimeEstimator

__all__ = ["JobFeatures", "JobFeaturesLike", "RuntimeEstimate", "RuntimeEstimator"]


class JobFeaturesLike(Protocol):
    """The attributes of a job an estimator may read: all known at submit."""

    @property
    def tenant(self) -> str: ...
    @property
    def num_gpus(self) -> int: ...
    @property
    def submit_time(self) -> float: ...
    @property
    def requested_limit_s(self) -> float | None: ...
    @property
    def name(self) -> str | None: ...
