"""The online estimator: learns from finished jobs, retrains in the background, never stops serving.

Protocol (docs/prediction.md):
- `observe(job, runtime_s)` records a finished job in the feature history and in a window of the
  newest `window` training rows (its features as of its own submit time). Every `retrain_every`
  observations it starts a training, unless one is already running.
- `retrain()` starts one on demand; `wait=True` blocks until it has finished.
- A training runs the `trainer` on a snapshot of the window (at most `max_train_rows` rows: the
  newest half of them and an even sample of the older ones). On success the new model is swapped in
  with the next version number; on failure the previous model keeps serving and the error is kept
  in `last_error` / `failed_trainings`.
- `predict(job)` uses the current model; before the first one it serves the naive per-tenant median.
  Predictions are never negative, p50 <= p90, and neither exceeds the job's requested limit.

With a `Retrainer` the training runs on its worker thread; without one it runs in the caller.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor

import msgspec
import numpy as np

from ibpool_core.clock import Clock

from .baseline import NaiveMedianEstimator
from .contract import JobFeaturesLike, RuntimeEstimate
from .history import FinishedJobHistory, log_runtime
from .model import QuantileModel, Trainer, TrainingSet, train_boosted_quantiles


class EstimatorConfig(msgspec.Struct, frozen=True):
    retrain_every: int | None = 2_000  # observations between trainings; None: only on demand
    window: int = 50_000  # newest finished jobs kept as training rows
    max_train_rows: int = 20_000  # rows given to one training (caps its time)
    min_train_rows: int = 200  # below this no training starts
    default_runtime_s: float = 3_600.0  # the naive fallback's answer before anything finished
    sample_seed: int = 0


class ModelVersion(msgspec.Struct, frozen=True):
    """Which model serves: its number (1, 2, ...), when it was trained, on how many rows, its holdout figures."""

    version: int
    trained_at: float  # POSIX seconds, from the estimator's clock
    n_samples: int
    metrics: dict[str, float]


def _pair(estimate: RuntimeEstimate) -> tuple[float, float]:
    return estimate.p50, estimate.p90


def _capped(job: JobFeaturesLike, p50: float, p90: float) -> RuntimeEstimate:
    """A job is stopped at its requested limit, so no quantile of its runtime exceeds it."""
    limit = job.requested_limit_s
    if limit is not None and limit >= 0:
        p50, p90 = min(p50, limit), min(p90, limit)
    return RuntimeEstimate(p50=max(p50, 0.0), p90=max(p90, p50, 0.0))


class _WallClock:
    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


class Retrainer:
    """Runs trainings off the serving thread: one worker, so at most one training at a time."""

    def __init__(self, executor: Executor | None = None) -> None:
        self._owned = executor is None
        self._executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="ibpool-retrain")

    def submit(self, work: Callable[[], None]) -> Future[None]:
        return self._executor.submit(work)

    def shutdown(self) -> None:
        """Wait for a running training and stop the worker (only a worker this Retrainer created)."""
        if self._owned:
            self._executor.shutdown(wait=True)


class _Observation(msgspec.Struct, frozen=True):
    tenant: str
    row: list[float]
    log_runtime: float


class LearnedEstimator:
    """A RuntimeEstimator backed by quantile gradient boosting, retrained online (see the module doc).

    `observe` and `predict` are meant for one caller thread; the swap of a trained model is atomic, so
    a background training never blocks or tears a prediction.
    """

    def __init__(
        self,
        config: EstimatorConfig | None = None,
        *,
        trainer: Trainer = train_boosted_quantiles,
        retrainer: Retrainer | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config or EstimatorConfig()
        self._trainer = trainer
        self._retrainer = retrainer
        self._clock = clock or _WallClock()
        self.history = FinishedJobHistory()
        self._naive = NaiveMedianEstimator(self.config.default_runtime_s, window=self.config.window)
        self._window: deque[_Observation] = deque(maxlen=self.config.window)
        self._lock = threading.Lock()
        self._serving: tuple[QuantileModel, ModelVersion] | None = None
        self._training: Future[None] | None = None
        self._next_version = 1
        self._rng = random.Random(self.config.sample_seed)
        self.observed = 0
        self.observed_since_training = 0
        self.failed_trainings = 0
        self.last_error: BaseException | None = None

    # --- serving ---------------------------------------------------------------------------

    @property
    def version(self) -> ModelVersion | None:
        """The serving model's version; None while the naive fallback serves."""
        serving = self._serving
        return serving[1] if serving else None

    def predict(self, job: JobFeaturesLike) -> RuntimeEstimate:
        return self.predict_many([job])[0]

    def predict_many(self, jobs: Sequence[JobFeaturesLike]) -> list[RuntimeEstimate]:
        """`predict` for many jobs in one model call (a tree ensemble costs ~1 ms per call, not per row)."""
        serving = self._serving  # one read: a swap during this call does not mix two models
        if serving is None or not jobs:
            return [_capped(job, *_pair(self._naive.predict(job))) for job in jobs]
        model = serving[0]
        lo, hi = model.predict_log([j.tenant for j in jobs], [self.history.features_at(j) for j in jobs])
        p50 = np.exp(lo)
        p90 = np.maximum(np.exp(hi), p50)  # two separate trees may cross; p90 is never below p50
        return [_capped(job, float(a), float(b)) for job, a, b in zip(jobs, p50, p90, strict=True)]

    # --- learning --------------------------------------------------------------------------

    def observe(self, job: JobFeaturesLike, runtime_s: float, *, finished_at: float | None = None) -> None:
        """Record a finished job; `finished_at` defaults to submit_time + runtime_s (no queueing known)."""
        if not math.isfinite(runtime_s) or runtime_s < 0:
            raise ValueError(f"runtime_s must be a finite non-negative number, got {runtime_s!r}")
        # Its row looks only at jobs that finished before its submit time, whatever arrived since.
        row = self.history.features_at(job)
        self.history.add(job, runtime_s, job.submit_time + runtime_s if finished_at is None else finished_at)
        self._naive.observe(job, runtime_s)
        self._window.append(_Observation(job.tenant, row, log_runtime(runtime_s)))
        self.observed += 1
        self.observed_since_training += 1
        every = self.config.retrain_every
        if every is not None and self.observed_since_training >= every:
            self.retrain()

    def retrain(self, *, wait: bool = False) -> bool:
        """Start a training on the current window; False when one is running or there are too few rows.

        With `wait`, return only when this training has finished (swapped in or failed).
        """
        with self._lock:
            if self._training is not None and not self._training.done():
                return False
            if len(self._window) < self.config.min_train_rows:
                return False
            data = self._training_set()
            self.observed_since_training = 0
            if self._retrainer is None:
                self._train(data)
                return True
            future = self._training = self._retrainer.submit(lambda: self._train(data))
        if wait:
            future.result()
        return True

    def _training_set(self) -> TrainingSet:
        rows = list(self._window)
        cap = self.config.max_train_rows
        if len(rows) > cap:  # the newest half whole, the older rows evenly sampled, finish order kept
            newest = cap // 2
            older = rows[:-newest]
            picked = sorted(self._rng.sample(range(len(older)), cap - newest))
            rows = [older[i] for i in picked] + rows[-newest:]
        return TrainingSet(
            tenants=[o.tenant for o in rows], rows=[o.row for o in rows], log_runtimes=[o.log_runtime for o in rows]
        )

    def _train(self, data: TrainingSet) -> None:
        try:
            trained = self._trainer(data)
        except Exception as e:  # any failure: the previous model keeps serving
            self.failed_trainings += 1
            self.last_error = e
            return
        version = ModelVersion(
            version=self._next_version,
            trained_at=self._clock.now().timestamp(),
            n_samples=len(data.log_runtimes),
            metrics=dict(trained.metrics),
        )
        self._next_version += 1
        self._serving = (trained.model, version)
