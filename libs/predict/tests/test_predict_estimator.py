"""The online estimator: fallback, versions, failing trainings, background retraining, sane outputs."""

from __future__ import annotations

import datetime as dt
import itertools
import math
import random
import subprocess
import sys
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from ibpool_core.clock import FixedClock
from ibpool_predict.contract import JobFeatures, RuntimeEstimate, RuntimeEstimator
from ibpool_predict.estimator import EstimatorConfig, LearnedEstimator, ModelVersion, Retrainer
from ibpool_predict.model import (
    BoostParams,
    FloatArray,
    TrainedModel,
    Trainer,
    TrainingSet,
    train_boosted_quantiles,
)

T0 = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)


class ConstantModel:
    """Predicts the same log-runtimes for every row (p90 deliberately below p50 when asked)."""

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi = lo, hi

    def predict_log(self, tenants: Sequence[str], rows: Sequence[Sequence[float]]) -> tuple[FloatArray, FloatArray]:
        return np.full(len(rows), self.lo), np.full(len(rows), self.hi)


def constant_trainer(lo: float, hi: float) -> Trainer:
    def train(data: TrainingSet) -> TrainedModel:
        return TrainedModel(model=ConstantModel(lo, hi), metrics={"rows": float(len(data.rows))})

    return train


def failing_trainer(data: TrainingSet) -> TrainedModel:
    raise RuntimeError("the training host ran out of memory")


def _stream(n: int, seed: int = 0) -> list[tuple[JobFeatures, float]]:
    rng = random.Random(seed)
    out = []
    for k in range(n):
        gpus = rng.choice([1, 2, 4, 8])
        job = JobFeatures(tenant=rng.choice(["a", "b"]), num_gpus=gpus, submit_time=1.7e9 + 60.0 * k)
        out.append((job, 100.0 * gpus * math.exp(rng.gauss(0, 0.2))))
    return out


def test_the_estimators_satisfy_the_protocol() -> None:
    estimator: RuntimeEstimator = LearnedEstimator()
    assert isinstance(estimator.predict(JobFeatures(tenant="a", num_gpus=1, submit_time=0.0)), RuntimeEstimate)


def test_before_the_first_model_it_serves_the_tenant_median() -> None:
    est = LearnedEstimator(EstimatorConfig(retrain_every=None, default_runtime_s=1_234.0))
    job = JobFeatures(tenant="a", num_gpus=1, submit_time=1_000.0)
    assert est.predict(job) == RuntimeEstimate(p50=1_234.0, p90=1_234.0)
    for runtime in (10.0, 20.0, 30.0):
        est.observe(JobFeatures(tenant="a", num_gpus=1, submit_time=0.0), runtime)
    est.observe(JobFeatures(tenant="b", num_gpus=1, submit_time=0.0), 5_000.0)
    assert est.version is None
    assert est.predict(job).p50 == 20.0
    assert est.predict(JobFeatures(tenant="new", num_gpus=1, submit_time=1_000.0)).p50 == 25.0  # pool-wide


def test_versions_increase_and_record_when_and_on_what() -> None:
    clock = FixedClock(T0)
    est = LearnedEstimator(
        EstimatorConfig(retrain_every=50, min_train_rows=10), trainer=constant_trainer(1.0, 2.0), clock=clock
    )
    versions: list[ModelVersion] = []
    for job, runtime in _stream(200):
        clock.advance(60)
        est.observe(job, runtime)
        if est.version is not None and (not versions or versions[-1] != est.version):
            versions.append(est.version)
    assert [v.version for v in versions] == [1, 2, 3, 4]
    assert [v.n_samples for v in versions] == [50, 100, 150, 200]
    assert all(a.trained_at < b.trained_at for a, b in itertools.pairwise(versions))
    assert versions[-1].metrics == {"rows": 200.0}


def test_a_failing_training_leaves_the_previous_model_serving() -> None:
    est = LearnedEstimator(EstimatorConfig(retrain_every=None, min_train_rows=10), trainer=constant_trainer(3.0, 4.0))
    stream = _stream(40)
    for job, runtime in stream[:20]:
        est.observe(job, runtime)
    assert est.retrain()
    before, served = est.version, est.predict(stream[0][0])
    est._trainer = failing_trainer  # the next training fails
    for job, runtime in stream[20:]:
        est.observe(job, runtime)
    assert est.retrain()
    assert est.version == before and est.predict(stream[0][0]) == served == RuntimeEstimate(math.exp(3), math.exp(4))
    assert est.failed_trainings == 1 and isinstance(est.last_error, RuntimeError)


def test_background_training_never_blocks_serving_and_a_failure_keeps_the_old_model() -> None:
    gate = threading.Event()
    calls = 0

    def slow_then_failing(data: TrainingSet) -> TrainedModel:
        nonlocal calls
        calls += 1
        if calls == 1:
            return TrainedModel(model=ConstantModel(2.0, 3.0), metrics={})
        gate.wait(timeout=30)
        raise RuntimeError("boom")

    retrainer = Retrainer()
    try:
        est = LearnedEstimator(
            EstimatorConfig(retrain_every=None, min_train_rows=5), trainer=slow_then_failing, retrainer=retrainer
        )
        stream = _stream(30)
        for job, runtime in stream[:10]:
            est.observe(job, runtime)
        assert est.retrain(wait=True) and est.version is not None and est.version.version == 1
        for job, runtime in stream[10:]:
            est.observe(job, runtime)
        assert est.retrain()  # runs on the worker and waits at the gate
        assert not est.retrain(), "a second training does not start while one runs"
        assert est.predict(stream[0][0]).p50 == pytest.approx(math.exp(2.0))  # served while training
        gate.set()
    finally:
        retrainer.shutdown()
    assert est.version.version == 1 and est.failed_trainings == 1
    assert est.predict(stream[0][0]).p50 == pytest.approx(math.exp(2.0))


def test_crossing_quantiles_are_sorted_and_nothing_is_negative() -> None:
    est = LearnedEstimator(EstimatorConfig(retrain_every=None, min_train_rows=5), trainer=constant_trainer(5.0, -40.0))
    for job, runtime in _stream(10):
        est.observe(job, runtime)
    est.retrain()
    guess = est.predict(_stream(1)[0][0])
    assert guess.p50 == pytest.approx(math.exp(5.0)) and guess.p90 == guess.p50


def test_real_model_predictions_are_non_negative_and_ordered() -> None:
    est = LearnedEstimator(
        EstimatorConfig(retrain_every=None, min_train_rows=50),
        trainer=lambda data: train_boosted_quantiles(data, BoostParams(max_iter=20)),
    )
    stream = _stream(600, seed=3)
    for job, runtime in stream:
        est.observe(job, runtime)
    assert est.retrain() and est.version is not None
    assert {"holdout_mae_s", "holdout_within_2x", "holdout_p90_coverage"} <= set(est.version.metrics)
    probes = [JobFeatures(tenant=t, num_gpus=g, submit_time=1.8e9) for t in ("a", "b", "unseen") for g in (1, 3, 64)]
    for guess in est.predict_many(probes):
        assert 0 <= guess.p50 <= guess.p90 and math.isfinite(guess.p90)


def test_a_negative_runtime_is_refused() -> None:
    with pytest.raises(ValueError, match="runtime_s"):
        LearnedEstimator().observe(JobFeatures(tenant="a", num_gpus=1, submit_time=0.0), -1.0)


def test_no_quantile_exceeds_the_requested_limit() -> None:
    est = LearnedEstimator(EstimatorConfig(retrain_every=None, min_train_rows=5), trainer=constant_trainer(9.0, 10.0))
    limited = JobFeatures(tenant="a", num_gpus=1, submit_time=2e9, requested_limit_s=600.0)
    assert est.predict(limited) == RuntimeEstimate(p50=600.0, p90=600.0)  # the fallback is capped too
    for job, runtime in _stream(10):
        est.observe(job, runtime)
    est.retrain()
    assert est.predict(limited) == RuntimeEstimate(p50=600.0, p90=600.0)
    assert est.predict(JobFeatures(tenant="a", num_gpus=1, submit_time=2e9)).p50 == pytest.approx(math.exp(9.0))


def test_a_training_sees_at_most_max_train_rows_newest_half_whole() -> None:
    seen: list[TrainingSet] = []

    def capture(data: TrainingSet) -> TrainedModel:
        seen.append(data)
        return TrainedModel(model=ConstantModel(1.0, 2.0), metrics={})

    est = LearnedEstimator(
        EstimatorConfig(retrain_every=None, window=300, max_train_rows=100, min_train_rows=10), trainer=capture
    )
    stream = _stream(500)
    for job, runtime in stream:
        est.observe(job, runtime)
    est.retrain()
    (data,) = seen
    assert len(data.log_runtimes) == 100 and est.version is not None and est.version.n_samples == 100
    newest = [math.log(max(r, 1.0)) for _, r in stream[-50:]]
    assert data.log_runtimes[-50:] == newest  # the newest half whole, in finish order
    window_start = [math.log(max(r, 1.0)) for _, r in stream[200:450]]
    assert all(v in window_start for v in data.log_runtimes[:50])  # older rows only from the window


def test_calibrated_p90_covers_nine_in_ten_of_the_holdout() -> None:
    rng = random.Random(5)
    rows = [[rng.random(), rng.random()] for _ in range(2_000)]
    # The newest tenth runs 3x longer than the past: trees fitted on the past under-cover it.
    logs = [r[0] + rng.gauss(0, 0.3) + (math.log(3) if k >= 1_800 else 0.0) for k, r in enumerate(rows)]
    data = TrainingSet(tenants=["a"] * len(rows), rows=rows, log_runtimes=logs)
    trained = train_boosted_quantiles(data, BoostParams(max_iter=30))
    assert trained.metrics["holdout_p90_coverage"] < 0.6 and trained.metrics["shift_p90"] > 0.5
    _, hi = trained.model.predict_log(data.tenants[1_800:], data.rows[1_800:])
    assert float(np.mean(np.asarray(logs[1_800:]) <= hi)) >= 0.9


def test_observations_start_background_trainings_by_themselves() -> None:
    retrainer = Retrainer()
    est = LearnedEstimator(
        EstimatorConfig(retrain_every=25, min_train_rows=10), trainer=constant_trainer(1.0, 2.0), retrainer=retrainer
    )
    for job, runtime in _stream(30):
        est.observe(job, runtime)
    retrainer.shutdown()  # waits for the training the 25th observation started
    assert est.version is not None and est.version.version == 1 and est.version.n_samples == 25
    assert est.observed_since_training == 5


def test_the_module_leaves_scikit_learn_to_load_learner() -> None:
    # A fresh interpreter: importing the model module does not import scikit-learn; load_learner does.
    script = (
        "import sys; import ibpool_predict.model as m; assert 'sklearn' not in sys.modules, 'imported early';"
        " m.load_learner(); assert 'sklearn.ensemble' in sys.modules, 'not loaded'"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_naive_fallback_keeps_only_its_window_of_runtimes() -> None:
    from ibpool_predict.baseline import NaiveMedianEstimator
    from ibpool_predict.contract import JobFeatures

    job = JobFeatures(tenant="a", num_gpus=1, submit_time=0.0)
    windowed, everything = NaiveMedianEstimator(window=3), NaiveMedianEstimator()
    for runtime in (1000.0, 1000.0, 1000.0, 10.0, 20.0, 30.0):
        windowed.observe(job, runtime)
        everything.observe(job, runtime)
    assert windowed.predict(job).p50 == 20.0  # the newest three: 10, 20, 30
    assert everything.predict(job).p50 == (30.0 + 1000.0) / 2
    assert windowed.predict(JobFeatures(tenant="b", num_gpus=1, submit_time=0.0)).p50 == 20.0  # pool-wide, windowed too
