"""The learned runtime model of the scheduler service: learns from finished jobs, predicts for queued ones.

`RuntimePredictor` owns an `ibpool_predict.estimator.LearnedEstimator` (quantile gradient boosting,
trained on a `Retrainer`'s worker thread) and the core's `RuntimeHistory` (what `gittins-learned`
reads). Everything but the training runs on the caller's thread (the event loop); a training never
blocks a cycle, and one that raises leaves the previous model serving.

What it learns from: the job history in Postgres, not the handlers' news. Replicas share durable
consumers, so one replica sees only some of the exits; every job that ended is in the `jobs` table
whichever replica wrote it. `sync` reads the ended jobs it has not seen yet, in finish order: the
first call reads the newest `window` of them (the warm-up: a restarted or newly elected scheduler
predicts from its first cycle), later calls what ended since: the ids of the last `sync_overlap_s`
are read again (transactions commit out of timestamp order, and replicas' clocks differ a little)
and only the records of ids not seen yet are fetched.

Which ended jobs are learned from (`learned_runtime`):
  - completed: the runtime the node agents reported;
  - failed (the workload exited non-zero, or a node failed under it): it held its GPUs for that
    long, which is what the scheduler plans with; jobs of a kind that keeps failing early are short,
    and the history features see it. A job failed after too many requeues never ended a run and is
    left out (no runtime);
  - killed at its time limit: from its start to its kill, i.e. its limit (a lower bound of what it
    wanted; predictions are capped at the limit anyway);
  - cancelled: never. Cancelling is a user's decision, not the workload's length: a job cancelled
    while queued has no runtime, one cancelled while running only a lower bound.

Predictions (`predictions`): one `predict_many` per cycle (at most one per `batch_interval_s`) for
the queued jobs not predicted yet.
A job's prediction is kept (by job id) while it waits and recomputed only when another model
version serves: the features are as of its submit time, so the same model gives the same answer
anyway, and a new model is the only thing that can make it better. Before the first model (version
0) the estimator answers the per-tenant median of finished jobs, and that answer is kept as well.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from collections.abc import Iterable, Mapping, Sequence

import asyncpg
import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge

from ibpool_core.clock import Clock
from ibpool_core.sched.queueing import LearnedGittins, QueuePolicy
from ibpool_core.sched.records import JobRecord, RuntimePrediction
from ibpool_core.sched.runtime import JobFeatures, RuntimeEstimate, RuntimeHistory
from ibpool_predict.estimator import EstimatorConfig, LearnedEstimator, Retrainer
from ibpool_predict.model import (
    BoostParams,
    TrainedModel,
    Trainer,
    TrainingSet,
    load_learner,
    train_boosted_quantiles,
)
from ibpool_runtime.logs import get_logger
from ibpool_runtime.metrics import ServiceMetrics, count_failure
from ibpool_runtime.outages import OUTAGES

from . import state
from .config import SchedulerConfig

log = get_logger(__name__)

# What a sync survives: the store away; a stored record that does not decode (msgspec's errors are
# ValueErrors) or whose numbers the features cannot take (a math domain error, a time out of range).
SYNC_FAILURES: tuple[type[Exception], ...] = (*OUTAGES, ValueError, ArithmeticError)
# Records fetched per query while syncing.
SYNC_BATCH = 2_000
# The warm-up yields to the event loop after this many jobs (~0.1-0.2 ms each to learn from, measured).
YIELD_EVERY = 500


class PredictorSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The model's knobs (from `SchedulerConfig.predict_*`)."""

    retrain_every: int = 500  # ended jobs learned from between two trainings
    min_train_rows: int = 200  # no training below this many learned jobs
    window: int = 20_000  # newest learned jobs kept as training rows (and read at warm-up)
    max_train_rows: int = 20_000  # rows given to one training (caps its time)
    sync_interval_s: float = 2.0  # how often the job history is read for newly ended jobs
    batch_interval_s: float = 0.5  # at most one model call per this many seconds of cycles
    sync_overlap_s: float = 10.0  # re-read this far back (late commits, clock skew between replicas)

    def check(self) -> None:
        """ValueError naming the field that is out of range."""
        for name in ("retrain_every", "min_train_rows", "window", "max_train_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"predict_{name} must be >= 1, got {getattr(self, name)}")
        if not self.sync_interval_s > 0:
            raise ValueError(f"predict_sync_interval_s must be > 0, got {self.sync_interval_s}")
        if not self.batch_interval_s >= 0:
            raise ValueError(f"predict_batch_interval_s must be >= 0, got {self.batch_interval_s}")
        if not self.sync_overlap_s >= 0:
            raise ValueError(f"sync_overlap_s must be >= 0, got {self.sync_overlap_s}")


class ModelStatus(msgspec.Struct, frozen=True, kw_only=True):
    """GET /v1/model: which model serves and how the learning goes on this replica."""

    enabled: bool
    # "model": a trained model serves; "median": none yet, the per-tenant median of ended jobs;
    # "off": `predict_runtime` is false.
    serving: str
    version: int | None = None
    trained_at: dt.datetime | None = None
    n_samples: int = 0  # rows the serving model was trained on
    metrics: dict[str, float] = {}  # its holdout figures (holdout_mae_s, holdout_within_2x, ...)
    learned_jobs: int = 0  # ended jobs learned from since this replica started (warm-up included)
    training_rows: int = 0  # rows the next training would start from (at most `window`)
    failed_trainings: int = 0
    last_error: str | None = None
    retrain_every: int = 0
    min_train_rows: int = 0
    window: int = 0


def features(job: JobRecord) -> JobFeatures:
    """What is known of a job at submit, as the estimators read it."""
    return JobFeatures(
        tenant=job.tenant,
        num_gpus=job.gpus,
        submit_time=job.submitted_at.timestamp(),
        requested_limit_s=job.time_limit_s,
        name=job.name or None,
    )


def learned_runtime(job: JobRecord) -> float | None:
    """The runtime (s) the model learns from an ended job, None when it learns nothing (module doc)."""
    if job.state == "completed" or job.state == "failed":
        if job.runtime_s > 0:
            return job.runtime_s
        began = job.started_at or job.scheduled_at
        if job.state == "completed" and job.finished_at is not None and began is not None:
            return max(0.0, (job.finished_at - began).total_seconds())
        return None  # failed without a run that ended (requeued too often): nothing to learn
    if job.state == "killed":
        began = job.started_at or job.scheduled_at
        if job.runtime_s > 0:
            return job.runtime_s
        if job.finished_at is None or began is None:
            return None
        return max(0.0, (job.finished_at - began).total_seconds())
    return None


def _single_thread_trainer(params: BoostParams) -> Trainer:
    def train(data: TrainingSet) -> TrainedModel:
        return train_boosted_quantiles(data, params)

    return train


class RuntimePredictor:
    """The estimator, the Gittins runtime history and the per-job prediction cache of one scheduler.

    `trainer` replaces the learner (tests inject one that raises); `retrainer` the worker (None: a
    one-thread `Retrainer` of its own, shut down by `close`). `registry`: where the model version
    gauge and the failed-trainings counter go; `metrics`: where a failed learner load or history sync
    is counted (`ibpool_loop_failures`, loops "runtime model load" and "runtime model sync").
    """

    def __init__(
        self,
        settings: PredictorSettings | None = None,
        *,
        clock: Clock,
        trainer: Trainer | None = None,
        retrainer: Retrainer | None = None,
        registry: CollectorRegistry | None = None,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.settings = s = settings or PredictorSettings()
        self.metrics = metrics
        s.check()
        self._retrainer = retrainer if retrainer is not None else Retrainer()
        self.estimator = LearnedEstimator(
            EstimatorConfig(
                retrain_every=None,  # trainings start here (after a sync), not in the middle of a warm-up
                window=s.window,
                max_train_rows=s.max_train_rows,
                min_train_rows=s.min_train_rows,
            ),
            trainer=trainer or _single_thread_trainer(BoostParams(threads=1)),
            retrainer=self._retrainer,
            clock=clock,
        )
        self.history = RuntimeHistory()
        self._cache: dict[str, tuple[int, RuntimeEstimate]] = {}  # job id -> (model version, estimate)
        self._predicted_at = -math.inf  # time.monotonic() of the last model call
        # The sync's position: the newest finish time read, and the ids read at or after it - overlap.
        self._synced_until: dt.datetime | None = None
        self._seen: dict[str, dt.datetime] = {}
        self.learned = 0
        self._failures_counted = 0
        self.model_version = Gauge(
            "ibpool_scheduler_model_version",
            "Version of the runtime model serving (0: none trained yet, the per-tenant median serves)",
            registry=registry,
        )
        self.failed_trainings = Counter(
            "ibpool_scheduler_model_trainings_failed",
            "Runtime model trainings that raised (the previous model kept serving)",
            registry=registry,
        )
        self.learned_jobs = Counter(
            "ibpool_scheduler_model_learned_jobs", "Ended jobs the runtime model learned from", registry=registry
        )

    # -- policies ----------------------------------------------------------------------------

    def attach(self, policies: Iterable[QueuePolicy]) -> None:
        """Give every `gittins-learned` policy this predictor's runtime history to read."""
        for policy in policies:
            if isinstance(policy, LearnedGittins):
                policy.history = self.history

    # -- learning ----------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The serving model's version; 0 while none is trained."""
        v = self.estimator.version
        return v.version if v is not None else 0

    def observe(self, job: JobRecord) -> bool:
        """Learn from one ended job; False when it teaches nothing (see `learned_runtime`)."""
        runtime = learned_runtime(job)
        if runtime is None or not math.isfinite(runtime):
            return False
        f = features(job)
        finished = job.finished_at.timestamp() if job.finished_at is not None else None
        self.estimator.observe(f, runtime, finished_at=finished)
        self.history.observe(f, runtime)
        self.learned += 1
        self.learned_jobs.inc()
        return True

    def maybe_retrain(self, *, force: bool = False, wait: bool = False) -> bool:
        """Start a background training once `retrain_every` jobs were learned since the last one (or
        with `force`, e.g. after the warm-up); False when none started (too few rows, one running).
        `wait`: return once it has finished (tests)."""
        self.refresh_metrics()
        if not force and self.estimator.observed_since_training < self.settings.retrain_every:
            return False
        started = self.estimator.retrain(wait=wait)
        if wait:
            self.refresh_metrics()
        return started

    def refresh_metrics(self) -> None:
        self.model_version.set(self.version)
        failed = self.estimator.failed_trainings
        if failed > self._failures_counted:
            self.failed_trainings.inc(failed - self._failures_counted)
            if self.estimator.last_error is not None:
                log.warning("runtime model training failed; the previous model keeps serving", error=self.last_error)
            self._failures_counted = failed

    @property
    def last_error(self) -> str | None:
        e = self.estimator.last_error
        return None if e is None else f"{type(e).__name__}: {e}"

    async def sync(self, conn: asyncpg.Connection | asyncpg.Pool) -> int:
        """Learn from the jobs that ended since the last call (the first call: the newest `window`);
        then start a training when due. Returns how many jobs were learned from."""
        first = self._synced_until is None
        if first:
            rows = await state.ended_jobs_newest(conn, self.settings.window)
        else:
            assert self._synced_until is not None
            since = self._synced_until - dt.timedelta(seconds=self.settings.sync_overlap_s)
            new = [(j, at) for j, at in await state.ended_job_ids_since(conn, since) if j not in self._seen]
            rows = []
            for k in range(0, len(new), SYNC_BATCH):
                chunk = new[k : k + SYNC_BATCH]
                found = await state.jobs_by_id(conn, [j for j, _ in chunk])
                rows.extend((found[j], at) for j, at in chunk if j in found)
        learned = 0
        for i, (job, at) in enumerate(rows):
            if self._synced_until is None or at > self._synced_until:
                self._synced_until = at
            self._seen[job.job_id] = at
            learned += self.observe(job)
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # a warm-up of thousands of jobs must not stall the loop
        if self._synced_until is None:
            self._synced_until = dt.datetime.fromtimestamp(0, dt.UTC)
        horizon = self._synced_until - dt.timedelta(seconds=self.settings.sync_overlap_s)
        if len(self._seen) > 2 * SYNC_BATCH:
            self._seen = {j: at for j, at in self._seen.items() if at > horizon}
        if first and learned:
            log.info("runtime model warmed up from the job history", jobs=learned)
        self.maybe_retrain(force=first)
        return learned

    async def load(self) -> None:
        """Import the learner (scikit-learn) on the training worker and wait for it. Called before
        the service serves: the import holds the interpreter's lock for about a second (longer on a
        busy machine), which would pause the event loop's consumers and cycles if it came later."""
        try:
            await asyncio.wrap_future(self._retrainer.submit(load_learner))
        except (ImportError, OSError) as e:
            # scikit-learn (or a shared library under it) missing or broken: the service still serves,
            # trainings fail (counted as failed trainings) and the fallback predicts.
            count_failure(self.metrics, "runtime model load", e)
            log.warning("the runtime model's learner could not be loaded", error=f"{type(e).__name__}: {e}")

    async def run(self, pool: asyncpg.Pool, stop: asyncio.Event) -> None:
        """Sync every `sync_interval_s` until `stop`; a store outage or a stored job that cannot be
        learned from is logged, counted and retried (trainings fail apart: `failed_trainings`)."""
        try:
            while not stop.is_set():
                try:
                    await self.sync(pool)
                except SYNC_FAILURES as e:  # a training's own errors stay on its worker thread
                    count_failure(self.metrics, "runtime model sync", e)
                    log.warning("runtime model sync failed", error=str(e) or type(e).__name__)
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self.settings.sync_interval_s)
                except TimeoutError:
                    pass
        finally:
            await asyncio.get_running_loop().run_in_executor(None, self.close)

    def close(self) -> None:
        """Wait for a running training and stop the worker."""
        self._retrainer.shutdown()

    # -- predicting --------------------------------------------------------------------------

    def predictions(self, jobs: Sequence[JobRecord]) -> dict[str, RuntimeEstimate]:
        """job id -> its estimate for the queued jobs of `jobs`: kept ones while the model version is
        the same, the rest in one `predict_many`. A model call costs ~2-4 ms for a few rows and ~12-16 ms
        for 200 (measured; docs/prediction.md), so it is made at most once per `batch_interval_s`: in between, a new job
        has no prediction yet (it is planned with its limit, as with prediction off) and a job
        predicted by an older version keeps that answer. The cache keeps only these jobs afterwards."""
        version = self.version
        queued = [j for j in jobs if j.state == "queued"]
        cache: dict[str, tuple[int, RuntimeEstimate]] = {}
        fresh: list[JobRecord] = []
        for j in queued:
            hit = self._cache.get(j.job_id)
            if hit is not None:
                cache[j.job_id] = hit
            if hit is None or hit[0] != version:
                fresh.append(j)
        clock = time.monotonic()
        if fresh and clock - self._predicted_at >= self.settings.batch_interval_s:
            self._predicted_at = clock
            for job, estimate in zip(fresh, self.estimator.predict_many([features(j) for j in fresh]), strict=True):
                cache[job.job_id] = (version, estimate)
        self._cache = cache
        return {job_id: estimate for job_id, (_, estimate) in cache.items()}

    def stamped(self, job: JobRecord) -> JobRecord:
        """`job` carrying its cached prediction (as `JobRecord.predicted`); the same record when it
        has none cached or already carries it."""
        hit = self._cache.get(job.job_id)
        if hit is None:
            return job
        version, estimate = hit
        p = RuntimePrediction(p50_s=round(estimate.p50, 3), p90_s=round(estimate.p90, 3), model_version=version)
        return job if job.predicted == p else msgspec.structs.replace(job, predicted=p)

    # -- status ------------------------------------------------------------------------------

    def status(self) -> ModelStatus:
        self.refresh_metrics()
        v = self.estimator.version
        s = self.settings
        return ModelStatus(
            enabled=True,
            serving="model" if v is not None else "median",
            version=v.version if v is not None else None,
            trained_at=dt.datetime.fromtimestamp(v.trained_at, dt.UTC) if v is not None else None,
            n_samples=v.n_samples if v is not None else 0,
            metrics=dict(v.metrics) if v is not None else {},
            learned_jobs=self.learned,
            training_rows=min(self.learned, s.window),
            failed_trainings=self.estimator.failed_trainings,
            last_error=self.last_error,
            retrain_every=s.retrain_every,
            min_train_rows=s.min_train_rows,
            window=s.window,
        )


DISABLED = ModelStatus(enabled=False, serving="off")


def estimates_of(predictor: RuntimePredictor | None, jobs: Sequence[JobRecord]) -> Mapping[str, RuntimeEstimate]:
    """The cycle's predictions (none without a predictor)."""
    return predictor.predictions(jobs) if predictor is not None else {}


def status_of(predictor: RuntimePredictor | None) -> ModelStatus:
    return predictor.status() if predictor is not None else DISABLED


def settings_of(cfg: SchedulerConfig) -> PredictorSettings:
    """The `predict_*` fields of a SchedulerConfig."""
    return PredictorSettings(
        retrain_every=cfg.predict_retrain_every,
        min_train_rows=cfg.predict_min_train_rows,
        window=cfg.predict_window,
        max_train_rows=cfg.predict_max_train_rows,
        sync_interval_s=cfg.predict_sync_interval_s,
        batch_interval_s=cfg.predict_batch_interval_s,
    )
