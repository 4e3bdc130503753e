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
from .runtime import RuntimeHistory

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
SERVICES = {"gpu-time": 0.0, "time": 1.0}


class LeastAttainedService:
    """Tiresias' discretised 2D-LAS: queues by attained GPU-time (GPUs x seconds run), FIFO inside.

    A job is in queue i when its attained service passed i of the `thresholds`. Preemptive: a
    waiting job displaces running jobs of a strictly higher queue, so a job is demoted, not
    preempted, at every small step. Needs no runtime estimate at all. `service` is what the
    thresholds count: "gpu-time" (GPU-seconds, Tiresias' 2D-LAS, the default) or "time" (seconds
    run, whatever the GPU count: 1D-LAS, which demotes an 8-GPU job 8x later than 2D-LAS does); a
    number e counts attained GPU-seconds / GPUs^e (0 is "gpu-time", 1 is "time").
    """

    preemptive = True
    refresh_s: float | None = None

    def __init__(
        self, thresholds: Sequence[float] = DEFAULT_LAS_THRESHOLDS_GPU_S, service: str | float = "gpu-time"
    ) -> None:
        if isinstance(service, str) and service not in SERVICES:
            raise ValueError(f"LAS service must be one of {', '.join(SERVICES)} or an exponent, got {service!r}")
        self._exponent = SERVICES[service] if isinstance(service, str) else float(service)
        self.thresholds = tuple(sorted(thresholds))
        self.service = service
        self._units: dict[int, float] = {}
        self.name = "las"
        self.orders: tuple[str, ...] = ("las",)

    def service_of(self, gpus: int, attained_gpu_s: float) -> float:
        """Attained service in the unit of the thresholds."""
        return attained_gpu_s / self._per_unit(gpus)

    def _per_unit(self, gpus: int) -> float:
        """GPU-seconds per unit of service for a job of `gpus` GPUs (GPUs^exponent), memoised."""
        unit = self._units.get(gpus)
        if unit is None:
            unit = self._units[gpus] = 1.0 if self._exponent == 0.0 else float(max(1, gpus)) ** self._exponent
        return unit

    def thresholds_gpu_s(self, gpus: int) -> tuple[float, ...]:
        """The thresholds in attained GPU-seconds for a job of `gpus` GPUs (when its queue changes)."""
        per_unit = self._per_unit(gpus)
        return self.thresholds if per_unit == 1.0 else tuple(t * per_unit for t in self.thresholds)

    def queue_of(self, attained: float) -> int:
        """The queue of a job with `attained` service (in the thresholds' unit)."""
        return bisect.bisect_right(self.thresholds, attained)

    def job_queue(self, job: Job, attained_gpu_s: float) -> int:
        return self.queue_of(self.service_of(job.gpus, attained_gpu_s))

    def choose_order(self, stats: QueueStats) -> str:
        return self.orders[0]

    def order_key(self, order: str, job: Job, fairshare: Mapping[str, float]) -> SortKey:
        return (float(self.job_queue(job, job.attained_gpu_s)), job.submit_time, job.id)

    def waiting_rank(self, job: Job) -> float:
        return float(self.job_queue(job, job.attained_gpu_s))

    def running_rank(self, run: RunningJob, now: float) -> float:
        # job_queue(run.job, attained_at(run, now)) inlined: called for every running job every cycle.
        job = run.job
        ran = now - run.started_at
        attained = job.attained_gpu_s + job.gpus * (ran if ran > 0.0 else 0.0)
        unit = self._units.get(job.gpus)
        if unit is None:
            unit = self._per_unit(job.gpus)
        return float(bisect.bisect_right(self.thresholds, attained / unit))


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

    The index comes from a service distribution (sorted `samples` in the unit of `service`, e.g.
    earlier jobs' GPU-times) at the job's attained service, with the quanta the queue thresholds.
    Preemption is by queue, as LAS.
    """

    def __init__(
        self,
        samples: Sequence[float] = (),
        thresholds: Sequence[float] = DEFAULT_LAS_THRESHOLDS_GPU_S,
        service: str | float = "gpu-time",
    ):
        super().__init__(thresholds, service)
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

    def job_index(self, job: Job) -> float:
        """The job's Gittins index at its attained service (higher runs first)."""
        return self.index(self.service_of(job.gpus, job.attained_gpu_s))

    def order_key(self, order: str, job: Job, fairshare: Mapping[str, float]) -> SortKey:
        queue = self.job_queue(job, job.attained_gpu_s)
        return (queue - min(0.999, self.job_index(job)), job.submit_time, job.id)


class LearnedGittins(Gittins):
    """Gittins index from the learned, conditional runtime distribution of the job's own kind.

    The index of a job comes from `history` (`RuntimeHistory`): the runtimes of finished jobs of the
    same tenant and GPU count (else the tenant, else all), in the unit of `service` (x GPUs for
    GPU-time), at the job's attained service, with the quanta the thresholds and 10x the last. The
    caller feeds `history.observe` as jobs end; what is derived from it is recomputed once
    `refresh_every` more jobs ended. A waiting job's key is computed when it is queued (arrival or
    requeue) and kept while it waits. With no history yet every index is 0 (FIFO).

    `ranks` says what orders and preempts:
      - "queue": as `gittins`: LAS queues by the thresholds, highest index first inside a queue,
        a waiting job preempts only running jobs of a strictly higher queue;
      - "index": highest index first, whatever the queue, and a waiting job preempts a running one
        whose index (at the last threshold its attained service passed) is below its own divided by
        `index_margin`: the margin keeps jobs of close indices from thrashing and pays for the
        checkpoint/restore. A long job whose kind usually ends soon after the service it attained
        keeps its GPUs; one past every sample of its kind is the first to go.
    """

    def __init__(
        self,
        history: RuntimeHistory | None = None,
        thresholds: Sequence[float] = DEFAULT_LAS_THRESHOLDS_GPU_S,
        service: str | float = "gpu-time",
        *,
        ranks: str = "queue",
        index_margin: float = 2.0,
        refresh_every: int = 1,
    ) -> None:
        super().__init__((), thresholds, service)
        if ranks not in ("queue", "index"):
            raise ValueError(f"gittins-learned ranks must be queue or index, got {ranks!r}")
        if index_margin < 1.0 or refresh_every < 1:
            raise ValueError(f"index_margin must be >= 1 and refresh_every >= 1, got {index_margin}, {refresh_every}")
        self.name = "gittins-learned"
        self.orders = ("gittins-learned",)
        self.history = history if history is not None else RuntimeHistory()
        self.ranks = ranks
        self._log_margin = math.log2(index_margin)
        self._refresh_every = refresh_every
        self._learned_memo: dict[tuple[object, int, float], float] = {}
        self._run_ranks: dict[str, tuple[int, int, float]] = {}  # job id -> (queue, memo version, rank)
        self._memo_version = -refresh_every

    def index_at(self, job: Job, attained: float) -> float:
        """The job's index at `attained` service (in the thresholds' unit)."""
        history = self.history
        if history.version - self._memo_version >= self._refresh_every:
            self._learned_memo.clear()
            self._run_ranks.clear()
            self._memo_version = history.version
        memo_key = (history.key_for(job.tenant, job.gpus), job.gpus, attained)
        found = self._learned_memo.get(memo_key)
        if found is None:
            runtimes = history.samples(job.tenant, job.gpus)
            scale = max(1, job.gpus) / self._per_unit(job.gpus)  # runtime s -> service unit
            samples = [r * scale for r in runtimes] if scale != 1.0 else runtimes
            found = gittins_index(samples, attained, self._quanta) if samples else 0.0
            self._learned_memo[memo_key] = found
        return found

    def job_index(self, job: Job) -> float:
        return self.index_at(job, self.service_of(job.gpus, job.attained_gpu_s))

    def order_key(self, order: str, job: Job, fairshare: Mapping[str, float]) -> SortKey:
        index = self.job_index(job)
        if self.ranks == "index":
            return (-index, job.submit_time, job.id)
        # index / (1 + index) keeps the order of any indices inside [0, 1): the queue stays the major key.
        return (self.job_queue(job, job.attained_gpu_s) - index / (1.0 + index), job.submit_time, job.id)

    def waiting_rank(self, job: Job) -> float:
        if self.ranks == "queue":
            return super().waiting_rank(job)
        return _log_rank(self.job_index(job))

    def running_rank(self, run: RunningJob, now: float) -> float:
        if self.ranks == "queue":
            return LeastAttainedService.running_rank(self, run, now)
        queue = self.job_queue(run.job, attained_at(run, now))
        cached = self._run_ranks.get(run.job.id)
        if cached is not None and cached[0] == queue and cached[1] == self._memo_version:
            return cached[2]
        passed = self.thresholds[queue - 1] if queue > 0 else 0.0
        rank = _log_rank(self.index_at(run.job, passed)) - self._log_margin
        self._run_ranks[run.job.id] = (queue, self._memo_version, rank)
        return rank


def _log_rank(index: float) -> float:
    """-log2(index): smaller for a higher index; an index of 0 (nothing known) ranks last."""
    return -math.log2(index) if index > 0 else math.inf


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
        queue = float(self.job_queue(job, job.attained_gpu_s))
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
    "gittins-learned": LearnedGittins,
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
