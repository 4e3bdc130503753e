"""The model's fast path (its trees read directly) answers exactly what scikit-learn's `predict` does."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingRegressor  # type: ignore[import-untyped]

from ibpool_predict.contract import JobFeatures
from ibpool_predict.estimator import EstimatorConfig, LearnedEstimator
from ibpool_predict.model import BoostedQuantileModel, BoostParams, TrainingSet, runtime_errors, train_boosted_quantiles


def _training_set(n: int, seed: int) -> TrainingSet:
    """Rows of the real feature layout: tenants of unequal size, NaN where nothing is known yet."""
    rng = random.Random(seed)
    est = LearnedEstimator(EstimatorConfig(retrain_every=None, window=n))
    t = 1.7e9
    for _ in range(n):
        t += rng.expovariate(1 / 60.0)
        tenant = f"t{min(int(rng.expovariate(0.3)), 40)}"
        gpus = rng.choice([1, 2, 4, 8])
        job = JobFeatures(
            tenant=tenant,
            num_gpus=gpus,
            submit_time=t,
            requested_limit_s=rng.choice([None, 3_600.0]),
            name=rng.choice([None, "train", "eval"]),
        )
        est.observe(job, 50.0 * gpus * (1 + int(tenant[1:]) % 4) * math.exp(rng.gauss(0, 0.8)))
    return est._training_set()


def _probes(data: TrainingSet, seed: int) -> tuple[list[str], list[list[float]]]:
    """Held rows, the same rows with unknown tenants, and rows with every feature missing."""
    rng = random.Random(seed)
    picked = rng.sample(range(len(data.rows)), 300)
    tenants = [data.tenants[i] for i in picked] + ["never-seen"] * 100 + sorted(set(data.tenants))
    width = len(data.rows[0])
    rows = [data.rows[i] for i in picked] + [data.rows[i] for i in picked[:100]]
    rows += [[math.nan] * width for _ in range(len(tenants) - len(rows))]
    return tenants, rows


def test_fast_predictions_equal_scikit_learns_on_a_fixed_model() -> None:
    data = _training_set(3_000, seed=11)
    trained = train_boosted_quantiles(data, BoostParams(max_iter=60))
    model = trained.model
    assert isinstance(model, BoostedQuantileModel) and model.fast
    assert model.shift_p90 != 0.0  # calibrated: the shift is part of what must match
    tenants, rows = _probes(data, seed=12)
    lo, hi = model.predict_log(tenants, rows)
    x = model.matrix(tenants, rows)[:, model.columns]
    want_lo = model._p50.predict(x) + model.shift_p50
    want_hi = model._p90.predict(x) + model.shift_p90
    assert np.allclose(lo, want_lo, rtol=0, atol=1e-9) and np.allclose(hi, want_hi, rtol=0, atol=1e-9)
    assert np.array_equal(lo, want_lo) and np.array_equal(hi, want_hi)  # the same sum in the same order
    # One row at a time answers the same as the batch.
    one = [model.predict_log([t], [r]) for t, r in zip(tenants[:20], rows[:20], strict=True)]
    assert [float(a[0]) for a, _ in one] == lo[:20].tolist()


def test_a_model_whose_codes_are_not_what_the_encoder_saw_falls_back_to_predict() -> None:
    rng = np.random.default_rng(3)
    codes = rng.choice([0.0, 5.0, 7.0], size=600)  # not 0..k-1: the encoder renumbers them
    x = np.column_stack([codes, rng.normal(size=600)])
    y = codes / 3 + x[:, 1] + rng.normal(scale=0.1, size=600)
    categorical = np.array([True, False])
    fitted = [
        HistGradientBoostingRegressor(loss="quantile", quantile=q, max_iter=20, categorical_features=categorical).fit(
            x, y
        )
        for q in (0.5, 0.9)
    ]
    p50, p90 = fitted
    model = BoostedQuantileModel({"a": 0, "b": 5, "c": 7}, np.array([True, True]), p50, p90, shift_p90=0.25)
    assert not model.fast
    rows = [[v] for v in x[:50, 1]]
    tenants = [{0.0: "a", 5.0: "b", 7.0: "c"}[c] for c in codes[:50]]
    lo, hi = model.predict_log(tenants, rows)
    assert np.array_equal(lo, p50.predict(x[:50])) and np.array_equal(hi, p90.predict(x[:50]) + 0.25)


def test_holdout_figures_are_those_of_scikit_learns_predict() -> None:
    data = _training_set(1_200, seed=5)
    trained = train_boosted_quantiles(data, BoostParams(max_iter=30))
    model = trained.model
    assert isinstance(model, BoostedQuantileModel) and model.fast
    n_fit = int(trained.metrics["n_fit"])
    x = model.matrix(data.tenants, data.rows)[n_fit:, model.columns]
    true_s = np.exp(np.asarray(data.log_runtimes[n_fit:]))
    errors = runtime_errors(np.exp(model._p50.predict(x)), true_s)
    assert trained.metrics["holdout_mae_s"] == errors["mae_s"]
    assert trained.metrics["holdout_within_2x"] == errors["within_2x"]
    assert trained.metrics["shift_p90"] == model.shift_p90 != 0.0


def test_rows_of_another_width_are_refused() -> None:
    data = _training_set(400, seed=2)
    model = train_boosted_quantiles(data, BoostParams(max_iter=5)).model
    with pytest.raises(ValueError, match=r"feature rows have 3 values; this model was trained on rows of 44"):
        model.predict_log(["t1"], [[1.0, 2.0, 3.0]])
