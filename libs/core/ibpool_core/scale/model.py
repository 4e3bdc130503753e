"""What the autoscaler decides about: deployments, their replicas, metric samples, requests and replies.

A decision is one pure call, `decide(ScalingRequest) -> ScalingReply` (see `policies`): the request
holds the deployment's spec, its replicas as they are now (ready or still starting), the recent
metric samples, `now`, the policy config and the scaler's memory from the previous reply; the reply
holds the desired replica count, the reason in words, the replicas to start and to stop, and the
memory to pass to the next call. Nothing is kept anywhere else, so a service can store the memory
with the deployment and a simulator can replay a trace through the very same function.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

import msgspec

WHOLE_GPU_MILLI = 1000

# What a target measures and how the HPA formula reads it:
#   requests_per_s   total arrival rate; target = requests/s per replica (an average value)
#   queue_length     total requests waiting; target = waiting requests per replica (an average value)
#   gpu_utilization  mean over the ready replicas, 0..1; target = the wanted mean (a utilisation)
#   p99_latency_s    the deployment's p99 latency; target = the wanted p99 (treated as a utilisation)
MetricName = Literal["requests_per_s", "queue_length", "gpu_utilization", "p99_latency_s"]
AVERAGE_VALUE_METRICS: frozenset[str] = frozenset({"requests_per_s", "queue_length"})

ReplicaState = Literal["starting", "ready"]


class ReplicaShape(msgspec.Struct, frozen=True, kw_only=True):
    """The GPU one replica holds: `gpus` whole GPUs on each of `hosts` hosts (a tensor-parallel model
    larger than one node), or (gpus=0) a fraction `gpu_milli` of one GPU."""

    gpus: int = 1
    gpu_milli: int = 0
    memory_mib: int = 0
    hosts: int = 1

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.gpu_milli < 0 or self.memory_mib < 0:
            raise ValueError("a replica shape cannot be negative")
        if self.hosts < 1:
            raise ValueError("a replica spans at least one host")
        if self.hosts > 1 and self.gpus == 0:
            raise ValueError("a fraction of a GPU is on one host (hosts must be 1)")
        if self.gpus == 0 and not 0 < self.gpu_milli < WHOLE_GPU_MILLI:
            raise ValueError("a fractional replica needs 0 < gpu_milli < 1000 (use gpus for whole GPUs)")
        if self.gpus > 0 and self.gpu_milli:
            raise ValueError("a replica holds whole GPUs or a fraction of one, not both")

    @property
    def gpu_equivalent(self) -> float:
        """GPUs held, fractions counted in thousandths (for GPU-hours)."""
        return float(self.gpus * self.hosts) if self.gpus else self.gpu_milli / WHOLE_GPU_MILLI


class MetricTarget(msgspec.Struct, frozen=True, kw_only=True):
    metric: MetricName
    value: float

    def __post_init__(self) -> None:
        if self.value <= 0:
            raise ValueError(f"target of {self.metric} must be > 0")


class Deployment(msgspec.Struct, frozen=True, kw_only=True):
    """An inference service: its replica bounds, the GPU shape of a replica and what it is scaled on.

    Scale to zero: when `scale_to_zero` is set and a cold start fits the budget (`cold_start_s <=
    cold_start_budget_s`, the wait a first request may see), the deployment goes to 0 replicas after
    `idle_window_s` without traffic, and wakes up at the first sample with traffic. Otherwise it
    never goes below max(min_replicas, 1).
    """

    name: str
    min_replicas: int = 1
    max_replicas: int = 10
    shape: ReplicaShape = ReplicaShape()
    targets: list[MetricTarget] = msgspec.field(
        default_factory=lambda: [MetricTarget(metric="requests_per_s", value=1.0)]
    )
    # Seconds from the start of a replica until it serves (GPU grant, image, weights, warm-up).
    cold_start_s: float = 120.0
    scale_to_zero: bool = False
    idle_window_s: float = 900.0
    cold_start_budget_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError("need 0 <= min_replicas <= max_replicas and max_replicas >= 1")
        if not self.targets:
            raise ValueError("a deployment needs at least one metric target")
        if self.cold_start_s < 0 or self.idle_window_s <= 0:
            raise ValueError("cold_start_s must be >= 0 and idle_window_s > 0")

    @property
    def may_scale_to_zero(self) -> bool:
        return self.scale_to_zero and self.cold_start_s <= self.cold_start_budget_s

    def target_of(self, metric: MetricName) -> float | None:
        for t in self.targets:
            if t.metric == metric:
                return t.value
        return None


class Replica(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: str
    state: ReplicaState
    # When the replica was started (starting) or became ready (ready).
    since: dt.datetime


class MetricSample(msgspec.Struct, frozen=True, kw_only=True):
    """One observation of the deployment over the interval ending at `at`; None = not measured."""

    at: dt.datetime
    requests_per_s: float | None = None
    queue_length: float | None = None
    gpu_utilization: float | None = None
    p99_latency_s: float | None = None


class ReactiveConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The HPA's knobs. Defaults and why:

    - tolerance 0.1 and the 300 s scale-down stabilisation window: the Kubernetes defaults.
    - scale up by at most max(+100%, +4 replicas) per 15 s: the Kubernetes default, fast enough to
      double a service within a cold start.
    - scale down by at most max(10%, 1 replica) per 60 s (Kubernetes allows -100% per 15 s): a
      diurnal decline takes hours, so a slow descent costs little GPU time, and a replica removed by
      mistake costs a full cold start to get back; the one-replica floor keeps small services moving.
    - metrics averaged over the last 60 s, so one noisy sample does not start replicas.
    """

    tolerance: float = 0.1
    scale_down_window_s: float = 300.0
    scale_up_window_s: float = 0.0
    up_percent: float = 100.0
    up_replicas: int = 4
    up_period_s: float = 15.0
    down_percent: float = 10.0
    down_replicas: int = 1
    down_period_s: float = 60.0
    metric_window_s: float = 60.0


class PredictiveConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The seasonal forecast (additive Holt-Winters on the request rate) and when it is trusted.

    - `step_s` buckets (5 min) of the request rate are the forecast's time series; one season is a
      day (`season_s`). alpha/beta/gamma are the smoothing factors of level, trend and season.
    - The forecast looks `cold_start_s + margin_s` ahead: a replica started now serves then.
    - Trusted only after `min_history_s` of buckets (one full season initialises it, then
      `min_history_s` counts from the start) and while both the recent relative one-step error (an
      exponentially weighted mean with `error_alpha`) and the last one are at most `max_error`;
      otherwise the reactive policy decides alone. The last error alone catches a burst at once
      (the smoothed one lags), and keeps the forecast out while its level is still inflated by it.
    - The forecast is raised by the recent relative error (`error_headroom`) so a noisy series gets
      a margin in proportion to how wrong the forecast has been lately.
    - `skip_outliers`: a bucket off the forecast by more than `max_error` is not learnt, unless
      such buckets last longer than `relearn_after_s` (a lasting change); see `forecast`.
    """

    step_s: float = 300.0
    season_s: float = 86400.0
    alpha: float = 0.3
    beta: float = 0.01
    gamma: float = 0.3
    margin_s: float = 120.0
    min_history_s: float = 86400.0 + 3600.0
    max_error: float = 0.25
    error_alpha: float = 0.2
    error_headroom: bool = True
    skip_outliers: bool = True
    relearn_after_s: float = 3600.0


class PolicyConfig(msgspec.Struct, frozen=True, kw_only=True):
    name: str = "reactive"
    reactive: ReactiveConfig = ReactiveConfig()
    predictive: PredictiveConfig = PredictiveConfig()


class Recommendation(msgspec.Struct, frozen=True, kw_only=True):
    at: dt.datetime
    replicas: int


class ScaleChange(msgspec.Struct, frozen=True, kw_only=True):
    """Replicas added (delta > 0) or removed (delta < 0) at `at`; the rate limits count these."""

    at: dt.datetime
    delta: int


class SeasonalForecast(msgspec.Struct, frozen=True, kw_only=True):
    """Additive Holt-Winters state, updated one bucket at a time (see `forecast`).

    `slot` is the absolute bucket number (epoch seconds // step) of the last bucket folded in;
    `pending_*` accumulate the samples of the bucket in progress.
    """

    step_s: float
    season_len: int
    level: float = 0.0
    trend: float = 0.0
    seasonal: list[float] = []
    # Raw bucket means of the first season, before the model is initialised from them.
    warmup: list[float] = []
    slot: int | None = None
    buckets_seen: int = 0
    pending_slot: int | None = None
    pending_sum: float = 0.0
    pending_count: int = 0
    last_sample_at: dt.datetime | None = None
    # Exponentially weighted relative one-step error, the last one, and how many went into it.
    error: float = 0.0
    last_error: float = 0.0
    errors_seen: int = 0
    # Consecutive buckets off the forecast by more than max_error.
    outlier_run: int = 0

    @property
    def initialised(self) -> bool:
        return len(self.seasonal) == self.season_len


class ScalerMemory(msgspec.Struct, frozen=True, kw_only=True):
    """What a decision needs from earlier ones: recommendations inside the stabilisation windows,
    replica changes inside the rate-limit periods, and the forecast state."""

    recommendations: list[Recommendation] = []
    changes: list[ScaleChange] = []
    forecast: SeasonalForecast | None = None


class ScalingRequest(msgspec.Struct, frozen=True, kw_only=True):
    deployment: Deployment
    replicas: list[Replica]
    # Oldest first; at least the metric window and, for scale to zero, the idle window.
    metrics: list[MetricSample]
    now: dt.datetime
    policy: PolicyConfig = PolicyConfig()
    memory: ScalerMemory = ScalerMemory()

    @property
    def ready(self) -> int:
        return sum(1 for r in self.replicas if r.state == "ready")

    @property
    def current(self) -> int:
        return len(self.replicas)


class ScalingReply(msgspec.Struct, frozen=True, kw_only=True):
    desired_replicas: int
    reason: str
    # Replicas to start now, and the ids of those to stop (starting ones first, newest first).
    add: int = 0
    remove: list[str] = []
    memory: ScalerMemory = ScalerMemory()
    # What the policy computed before stabilisation and limits, for logs and tests.
    recommended: int = 0
    forecast_requests_per_s: float | None = None
