"""Replay a trace in time order and score the learned estimator against the naive per-tenant median.

The replay is a clock over submit events. Before a job's submit time t, every job whose finish time
(submit + duration: a trace knows no queueing, so this is the earliest it could have finished) is
strictly before t has been observed by both estimators, and nothing else has; then both predict the
job. So each prediction uses only the past, like a scheduler would. The learned estimator is retrained
(synchronously, for a reproducible run) each time `retrain_every` new jobs have finished; jobs
submitted between two trainings are predicted in one batch by the model that served at their submit.

Scores per estimator: MAE of p50 in seconds, the share of jobs with p50 within 2x of the true runtime
(both floored at 1 s), and the p90 coverage (share of jobs that ran at most p90).
"""

from __future__ import annotations

import datetime as dt
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from ibpool_sim.traces import load_philly

from .baseline import NaiveMedianEstimator
from .contract import JobFeatures
from .estimator import EstimatorConfig, LearnedEstimator, ModelVersion
from .model import BoostParams, FloatArray, TrainedModel, TrainingSet, runtime_errors, train_boosted_quantiles


class TraceJob(msgspec.Struct, frozen=True):
    job: JobFeatures
    runtime_s: float


class MethodScore(msgspec.Struct, frozen=True):
    method: str
    jobs: int
    mae_s: float
    within_2x: float
    p90_coverage: float


class EvalReport(msgspec.Struct, frozen=True):
    trace: str
    jobs: int
    retrain_every: int
    max_train_rows: int
    models_trained: int
    first_model_at_job: int | None  # index in submit order of the first job a model predicted
    seconds: float
    seconds_training: float
    overall: list[MethodScore]
    after_first_model: list[MethodScore]  # the same, on the jobs submitted once a model served
    last_model_metrics: dict[str, float]


def load_philly_jobs(path: Path) -> list[TraceJob]:
    """Philly jobs as submit-time features (the virtual cluster is the tenant; no limit, no name)."""
    return [
        TraceJob(
            job=JobFeatures(tenant=j.virtual_cluster, num_gpus=j.num_gpus, submit_time=j.submitted_at.timestamp()),
            runtime_s=j.duration_s,
        )
        for j in load_philly(path)
    ]


class _TraceClock:
    """The replay's clock: the submit time being replayed (so trained_at is trace time)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.t, dt.UTC)


def _score(method: str, p50: FloatArray, p90: FloatArray, true_s: FloatArray) -> MethodScore:
    errors = runtime_errors(p50, true_s)
    return MethodScore(
        method=method,
        jobs=len(true_s),
        mae_s=errors["mae_s"],
        within_2x=errors["within_2x"],
        p90_coverage=float(np.mean(true_s <= p90)) if len(true_s) else 0.0,
    )


@dataclass(frozen=True)
class Replay:
    """Per-job predictions of a replay, in submit order (position p is the p-th job submitted)."""

    order: list[int]  # position -> index into the jobs given
    true_s: FloatArray
    naive_p50: FloatArray
    naive_p90: FloatArray
    learned_p50: FloatArray
    learned_p90: FloatArray
    models_trained: int
    first_model_at: int | None  # the first position a trained model predicted
    seconds_training: float
    last_version: ModelVersion | None


def replay_in_time_order(
    jobs: Sequence[TraceJob],
    *,
    retrain_every: int = 2_000,
    config: EstimatorConfig | None = None,
    params: BoostParams | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Replay:
    """Both estimators' predictions for every job, each made from the jobs finished before its submit."""
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].job.submit_time)
    base = config or EstimatorConfig()
    clock = _TraceClock()
    training_seconds = 0.0

    def trainer(data: TrainingSet) -> TrainedModel:
        nonlocal training_seconds
        t0 = time.perf_counter()
        try:
            return train_boosted_quantiles(data, params)
        finally:
            training_seconds += time.perf_counter() - t0

    learned = LearnedEstimator(msgspec.structs.replace(base, retrain_every=None), trainer=trainer, clock=clock)
    naive = NaiveMedianEstimator(base.default_runtime_s)
    n = len(order)
    true_s = np.array([jobs[i].runtime_s for i in order], dtype=np.float64)
    naive_p50, naive_p90 = np.empty(n), np.empty(n)
    learned_p50, learned_p90 = np.empty(n), np.empty(n)
    pending: list[int] = []  # positions waiting for the current model's batch prediction
    finishing: list[tuple[float, int]] = []  # (finish time, position) of submitted jobs
    first_model_at: int | None = None
    models = 0

    def flush() -> None:
        for pos, est in zip(pending, learned.predict_many([jobs[order[p]].job for p in pending]), strict=True):
            learned_p50[pos], learned_p90[pos] = est.p50, est.p90
        pending.clear()

    for pos, i in enumerate(order):
        job = jobs[i].job
        clock.t = job.submit_time
        while finishing and finishing[0][0] < job.submit_time:
            finished_at, done = heapq.heappop(finishing)
            done_job = jobs[order[done]]
            learned.observe(done_job.job, done_job.runtime_s, finished_at=finished_at)
            naive.observe(done_job.job, done_job.runtime_s)
            if learned.observed_since_training >= retrain_every:
                flush()  # the jobs submitted so far are predicted by the model that served them
                before = learned.version
                learned.retrain()
                if learned.version is not before:
                    models += 1
        guess = naive.predict(job)
        naive_p50[pos], naive_p90[pos] = guess.p50, guess.p90
        if learned.version is None:
            guess = learned.predict(job)  # the naive fallback, answered now from what has finished now
            learned_p50[pos], learned_p90[pos] = guess.p50, guess.p90
        else:
            if first_model_at is None:
                first_model_at = pos
            pending.append(pos)
        heapq.heappush(finishing, (job.submit_time + jobs[i].runtime_s, pos))
        if progress is not None and (pos % 1_000 == 0 or pos == n - 1):
            progress(pos + 1, n)
    flush()
    return Replay(
        order=order,
        true_s=true_s,
        naive_p50=naive_p50,
        naive_p90=naive_p90,
        learned_p50=learned_p50,
        learned_p90=learned_p90,
        models_trained=models,
        first_model_at=first_model_at,
        seconds_training=training_seconds,
        last_version=learned.version,
    )


def evaluate_in_time_order(
    jobs: Sequence[TraceJob],
    *,
    trace: str = "trace",
    retrain_every: int = 2_000,
    config: EstimatorConfig | None = None,
    params: BoostParams | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> EvalReport:
    """Score both estimators on `jobs` replayed in submit order (see the module doc)."""
    started = time.perf_counter()
    config = config or EstimatorConfig()
    r = replay_in_time_order(jobs, retrain_every=retrain_every, config=config, params=params, progress=progress)

    def scores(lo: int) -> list[MethodScore]:
        part = slice(lo, len(r.order))
        return [
            _score("naive per-tenant median", r.naive_p50[part], r.naive_p90[part], r.true_s[part]),
            _score("learned (quantile GBDT)", r.learned_p50[part], r.learned_p90[part], r.true_s[part]),
        ]

    return EvalReport(
        trace=trace,
        jobs=len(r.order),
        retrain_every=retrain_every,
        max_train_rows=config.max_train_rows,
        models_trained=r.models_trained,
        first_model_at_job=r.first_model_at,
        seconds=time.perf_counter() - started,
        seconds_training=r.seconds_training,
        overall=scores(0),
        after_first_model=scores(r.first_model_at) if r.first_model_at is not None else [],
        last_model_metrics=dict(r.last_version.metrics) if r.last_version else {},
    )
