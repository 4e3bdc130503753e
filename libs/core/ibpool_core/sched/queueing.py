"""Queue policies: which waiting job goes first, and which running job may be preempted for it. Pure.

A policy is registered by name (`POLICIES`, name -> factory of keyword parameters). Its contract:

- `orders` names the orders the policy may use; `choose_order(stats)` picks one from live state.
  Most policies have one order; `dynamic` switches between several.
- `order_key(order, job, fairshare)` is the sort key of a waiting job (smaller runs first). It must
  not change while the job waits, except through `fairshare`, which callers refresh every
  `refresh_s` seconds (Slurm's PriorityCalcPeriod). That is what lets a caller keep one sorted queue
  per order incrementally instead of sorting every cycle.
- `preemptive` policies also rank jobs for preemption: a waiting job may displace a running one only
  when its `waiting_rank` is strictly smaller than the running job's `running_rank` at `now`.
  Ranks are coarse (priority classes, LAS queues) so that jobs do not thrash on small differences.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from .jobs import Job, QueueStats, RunningJob

SortKey = tuple[float, float, str]
NO_FAIRSHARE: Mapping[str, float] = {}


class QueuePolicy(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def orders(self) -> tuple[str, ...]: ...
    @property
    def preemptive(self) -> bool: ...
    @property
    def refresh_s(self) -> float | None: ...

    def choose_order(self, stats: QueueStats) -> str:
        """One of `orders`, from live state only (no randomness)."""
        ...

    def order_key(self, order: str, job: Job, fairshare: Mapping[str, float]) -> SortKey:
        """Smaller first; ties broken by submit time then id so the order is total."""
        ...

    def waiting_rank(self, job: Job) -> float:
        """Preemptive policies: how deserving a waiting job is (smaller is more)."""
        ...

    def running_rank(self, run: RunningJob, now: float) -> float:
        """Preemptive policies: how deserving a running job is at `now` (smaller is more)."""
        ...


class _NonPreemptive:
    preemptive = False
    refresh_s: float | None = None

    def choose_order(self, stats: QueueStats) -> str:
        return self.orders[0]  # type: ignore[attr-defined, no-any-return]

    def waiting_rank(self, job: Job) -> float:
        return 0.0

    def running_rank(self, run: RunningJob, now: float) -> float:
        return 0.0


class Fifo(_NonPreemptive):
    """First come, first served by submit time."""

    name = "fifo"
    orders = ("fifo",)

    def order_key(self, order: str, job: Job, fairshare: Mapping[str, float]) -> SortKey:
        return (job.submit_time, job.submit_time, job.id)


def planned_runtime(job: Job, source: str) -> float:
    """The runtime a policy orders by: `oracle` (true), `requested`, or `predicted` (p50)."""
    if source == "oracle" and job.true_runtime_s is not None:
        return job.true_runtime_s
    if job.requested_runtime_s is not None:
        return job.requested_runtime_s
    if job.predicted is not None:
        return job.predicted.p50
    return job.time_limit_s if job.time_limit_s is not None else math.inf


class ShortestJobFirst(_NonPreemptive):
    """Shortest (requested, else predicted p50; `oracle`: true) runtime first, FIFO among equals."""

    def __init__(self, runtime: str = "predicted") -> None:
        self.runtime = runtime
        self.name = "oracle-sjf" if runtime == "oracle" else "sjf"
        self.orders = (self.name,)

    def order_key(self, order: str, job: Job, fairshare: Mapping[str, float]) -> SortKey:
        return (planned_runtime(job, self.runtime), job.submit_time, job.id)


class Predictive(_NonPreemptive):
    """Smallest predicted GPU-time first: predicted runtime x GPUs (Helios' QSSF)."""

    name = "predictive"
    orders = ("predictive",)

    def order_key(self, order: str, job: Job, fairshare: Mapping[str, float]) -> SortKey:
        return (planned_runtime(job, "predicted") * job.gpus, job.submit_time, job.id)


class PriorityAging(_NonPreemptive):
    """Slurm-multifactor-style priority: class, fair share and age, highest first.

    score(now) = class_weight * priority + fairshare_weight * F(tenant) + (now - submit) / aging_s,
    with F in [0, 1] from `fairshare.fairshare_factors`. The age term grows at the same rate for every
    waiting job, so the order does not depend on `now`: the key is -(class and fair-share terms) +
    submit / aging_s. No starvation: a job that waited `class_weight * dP * aging_s` (+ `aging_s` for
    fair share) longer than another outranks it whatever their classes, so every job eventually
    reaches the head. Preemptive when `preempt_classes`: a job displaces only lower classes.
    """

    name = "priority"
    orders = ("priority",)
    refresh_s: float | None = 3600.0

    def __init__(
        self,
        *,
        class_weight: float = 10.0,
        fairshare_weight: float = 1.0,
        aging_s: float = 86_400.0,
        preempt_classes: bool = False,
    ) -> None:
        self.class_weight = class_weight
        self.fairshare_weight = fairshare_weight
        self.aging_s = aging_s
        self.preemptive = preempt_classes

    def order_key(self, order: str, job: Job, fairshare: Mapping[str, float]) -> SortKey:
        boost = self.class_weight * job.priority + self.fairshare_weight * fairshare.get(job.tenant, 1.0)
        return (job.submit_time / self.aging_s - boost, job.submit_time, job.id)

    def waiting_rank(self, job: Job) -> float:
        return -float(job.priority)

    def running_rank(self, run: RunningJob, now: float) -> float:
        return -float(run.job.priority)


DEFAULT_LAS_THRESHOLDS_GPU_S = (3_600.0, 36_000.0, 360_000.0)


class LeastAttainedService:
    """Tiresias' discretised 2D-LAS: queues by attained GPU-time (GPUs x seconds run), FIFO inside.

    A job is in queue i when its attained GPU-seconds passed i of the `thresholds`. Preemptive: a
    waiting job displaces running jobs of a strictly higher queue, so a job is demoted, not
    preempted, at every small step. Needs no runtime estimate at all.
    """

    preemptive = True
    refresh_s: float | None = None

    def __init__(self, thresholds: Sequence[float] = DEFAULT_LAS_THRESHOLDS_GPU_S) -> None:
        self.thresholds = tuple(sorted(thresholds))
        self.name = "las"
        self.orders: tuple[str, ...] = ("las",)

    def queue_of(self, attained_gpu_s: float) -> int:
        return bisect.bisect_right(self.thresholds, attained_gpu_s)

    def choose_order(self, stats: QueueStats) -> str:
        return self.orders[0]

    def order_key(self, order: str, job: Job, fairshare: Mapping[str, float]) -> SortKey:
        return (float(self.queue_of(job.attained_gpu_s)), job.submit_time, job.id)

    def waiting_rank(self, job: Job) -> float:
        return float(self.queue_of(job.attained_gpu_s))

    def running_rank(self, run: RunningJob, now: float) -> float:
        return float(self.queue_of(attained_at(run, now)))


def attained_at(run: RunningJob, now: float) -> float:
    return run.job.attained_gpu_s + run.job.gpus * max(0.0, now - run.started_at)


def gittins_index(samples: Sequence[float], attained: float, quanta: Sequence[float]) -> float:
    """Gittins index of a job that attained `attained` service, for service sizes drawn from `samples`.

    G(a) = max over quanta D of P(S - a <= D | S > a) / E[min(S - a, D) | S > a]: the best ratio of
    completion probability to expected service spent in the next quantum. `samples` must be sorted.
    A job past every sample gets the index of the last sample's tail (0 would starve it forever).
    """
    start = bisect.bisect_right(samples, attained)
    tail = samples[start:]
    if not tail:
        return 1.0 / max(1.0, attained)
    best = 0.0
    for quantum in quanta:
        done = bisect.bisect_right(tail, attained + quantum)
        spent = sum(s - attained for s in tail[:done]) + quantum * (len(tail) - done)
        if spent > 0:
            best = max(best, done / spent)
    return best


class Gittins(LeastAttainedService):
    """Tiresias' Gittins-index variant: inside each LAS queue, highest Gittins index first.

    The index comes from a GPU-time distribution (sorted `samples`, e.g. earlier jobs' GPU-times) at
    the job's attained GPU-time, with the quanta the queue thresholds. Preemption is by queue, as LAS.
    """

    def __init__(self, samples: Sequence[float] = (), thresholds: Sequence[float] = DEFAULT_LAS_THRESHOLDS_GPU_S):
        super().__init__(thresholds)
        self.name = "gittins"
        self.orders = ("gittins",)
        self.samples = sorted(samples)
        self._quanta = (*self.thresholds, self.thresholds[-1] * 10)
        self._memo: dict[float, float] = {}

    def index(self, attained: float) -> float:
        found = self._memo.get(attained)
        if found is None:
            found = self._memo[attained] = gittins_index(self.samples, attained, self._quanta) if self.samples else 0.0
        return found

    def order_key(self, order: str, job: Job, fairshare: Mapping[str, float]) -> SortKey:
        queue = self.queue_of(job.attained_gpu_s)
        return (queue - min(0.999, self.index(job.attained_gpu_s)), job.submit_time, job.id)


class OracleSrtf:
    """Shortest remaining true runtime first, preemptive: the simulator's upper-bound baseline.

    Ranks are remaining seconds; a waiting job preempts a running one whose remaining time exceeds
    its own by more than `margin_s` (the checkpoint/restore cost it would add).
    """

    name = "oracle-srtf"
    orders = ("oracle-srtf",)
    preemptive = True
    refresh_s: float | None = None

    def __init__(self, margin_s: float = 60.0) -> None:
        self.margin_s = margin_s

    def choose_order(self, stats: QueueStats) -> str:
        return self.orders[0]

    def order_key(self, order: str, job: Job, fairshare: Mapping[str, float]) -> SortKey:
        return (planned_runtime(job, "oracle"), job.submit_time, job.id)

    def waiting_rank(self, job: Job) -> float:
        return planned_runtime(job, "oracle") + self.margin_s

    def running_rank(self, run: RunningJob, now: float) -> float:
        return planned_runtime(run.job, "oracle") - (now - run.started_at)


class Dynamic(Gittins):
    """Gittins-ordered LAS queues while the queue is short; predicted GPU-time inside them when it is long.

    A blend of `gittins` (robust to bad predictions: a job that runs long is demoted and can be
    preempted by fresh ones) and `predictive` (smallest predicted GPU-time first). The rule, from live
    `QueueStats` only:
      - "las-qssf" when at least `qssf_from` jobs wait and the 90th percentile of the queueing delay
        of the recently started jobs (`recent_wait_p90_s`) is below `starve_after_s`: inside a LAS
        queue, smallest predicted GPU-time first. With many jobs waiting, the order among fresh jobs
        (all of attained service 0, so one Gittins index) decides the average JCT, and the
        prediction is the only thing that tells them apart;
      - "gittins" otherwise: inside a LAS queue, highest Gittins index of the attained service first
        (FIFO among equal indices). With few jobs waiting there is little to reorder, and when new
        jobs start to wait long (the predictions are passing some of them over and over) the
        predictions stop deciding until the waits come down (bounded starvation).
    Preemption is by LAS queue, as `las`. Both keys are static while a job waits. The key's primary
    part of "las-qssf" is queue x 1e15 + predicted GPU-seconds (GPU-times stay far below 1e15).
    """

    def __init__(
        self,
        samples: Sequence[float] = (),
        *,
        qssf_from: int = 8,
        starve_after_s: float = 86_400.0,
        thresholds: Sequence[float] = DEFAULT_LAS_THRESHOLDS_GPU_S,
    ) -> None:
        super().__init__(samples, thresholds)
        self.name = "dynamic"
        self.orders = ("las-qssf", "gittins")
        self.qssf_from = qssf_from
        self.starve_after_s = starve_after_s

    def choose_order(self, stats: QueueStats) -> str:
        if stats.queue_len >= self.qssf_from and stats.recent_wait_p90_s < self.starve_after_s:
            return "las-qssf"
        return "gittins"

    def order_key(self, order: str, job: Job, fairshare: Mapping[str, float]) -> SortKey:
        if order == "gittins":
            return super().order_key(order, job, fairshare)
        queue = float(self.queue_of(job.attained_gpu_s))
        return (queue * 1e15 + planned_runtime(job, "predicted") * job.gpus, job.submit_time, job.id)


PolicyFactory = Callable[..., QueuePolicy]

POLICIES: dict[str, PolicyFactory] = {
    "fifo": Fifo,
    "sjf": ShortestJobFirst,
    "oracle-sjf": lambda **kw: ShortestJobFirst(runtime="oracle", **kw),
    "priority": PriorityAging,
    "predictive": Predictive,
    "las": LeastAttainedService,
    "tiresias": LeastAttainedService,
    "gittins": Gittins,
    "dynamic": Dynamic,
    "oracle-srtf": OracleSrtf,
}


def make_policy(name: str, **params: Any) -> QueuePolicy:
    """The registered policy `name` built with `params`; KeyError names the known policies."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown queue policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    return factory(**params)
