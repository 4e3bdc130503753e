"""The learner: two gradient-boosted trees on log-runtime, one per quantile (scikit-learn).

`train_boosted_quantiles` fits `HistGradientBoostingRegressor(loss="quantile")` at q=0.5 and q=0.9
on the older part of a training set and scores both on its newest part (a time-ordered holdout, the
honest figure for a model that will predict the future), then serves the fitted pair. The tenant is a
native categorical column; missing values (no requested limit, no name, no history yet) are NaN,
which the trees route on their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

if TYPE_CHECKING:
    from sklearn.ensemble import HistGradientBoostingRegressor  # type: ignore[import-untyped]
# scikit-learn itself is imported by `load_learner` or the first training (`_regressor`): it takes
# about a second to import, which the CLI, the simulator and tests that import this module need not
# pay. The scheduler pays it at start, before it serves (`load_learner`).


def load_learner() -> None:
    """Import scikit-learn now. The import holds the interpreter's lock for most of its second, so a
    service runs this before it serves rather than let its first training, later, pause the event
    loop that serves."""
    from sklearn.ensemble import HistGradientBoostingRegressor  # noqa: F401


FloatArray = npt.NDArray[np.float64]

# HistGradientBoosting bins categories into at most 255 values; rarer tenants share "unknown" (NaN).
MAX_TENANT_CODES = 254


class TrainingSet(msgspec.Struct, frozen=True):
    """Finished jobs in finish order: tenant, submit-time feature row (history.FEATURE_NAMES), log-runtime."""

    tenants: list[str]
    rows: list[list[float]]
    log_runtimes: list[float]


class QuantileModel(Protocol):
    def predict_log(self, tenants: Sequence[str], rows: Sequence[Sequence[float]]) -> tuple[FloatArray, FloatArray]:
        """Predicted (p50, p90) log-runtimes, one per row; p90 may be below p50 (callers sort them)."""
        ...


@dataclass(frozen=True)
class TrainedModel:
    """A trainer's output: the model and what its holdout said about it."""

    model: QuantileModel
    metrics: dict[str, float]


Trainer = Callable[[TrainingSet], TrainedModel]


class BoostParams(msgspec.Struct, frozen=True):
    max_iter: int = 150
    learning_rate: float = 0.1
    max_leaf_nodes: int = 31
    min_samples_leaf: int = 40
    holdout_fraction: float = 0.1  # the newest share of the set, scored and not fitted
    random_state: int = 0
    threads: int = 1  # OpenMP threads for fitting and predicting
    # Shift the quantiles (in log space) so that on the holdout p50 is the median and p90 covers 90%
    # (split-conformal calibration on the newest jobs: it follows drift the trees were fitted before).
    calibrate_p50: bool = False  # measured: +0.3 to +0.8 points within 2x, MAE up to 1% worse; off
    calibrate_p90: bool = True
    min_calibration_rows: int = 100


def runtime_errors(predicted_s: FloatArray, true_s: FloatArray) -> dict[str, float]:
    """MAE in seconds and the share within 2x of the truth (both floored at 1 s, as traces round)."""
    ratio = np.maximum(predicted_s, 1.0) / np.maximum(true_s, 1.0)
    return {
        "mae_s": float(np.mean(np.abs(predicted_s - true_s))),
        "within_2x": float(np.mean((ratio >= 0.5) & (ratio <= 2.0))),
    }


class BoostedQuantileModel:
    """Two fitted regressors on [tenant code] + feature row; predicts log-runtime quantiles.

    Predictions go through `_SummedTrees` (the trees read directly: 2-3 ms for a few rows with 150
    rounds, measured) once it has given the same answers as scikit-learn's `predict` on `check_rows`
    (default: one row per tenant code, nothing else known); otherwise through `predict` on one
    OpenMP thread (10-35 ms for a few rows: input checks, the categorical encoder and thread limits
    set per call).
    """

    def __init__(
        self,
        tenant_codes: dict[str, int],
        columns: npt.NDArray[np.bool_],
        p50: HistGradientBoostingRegressor,
        p90: HistGradientBoostingRegressor,
        shift_p50: float = 0.0,
        shift_p90: float = 0.0,
        *,
        check_rows: FloatArray | None = None,
    ):
        self.tenant_codes = tenant_codes
        self.columns = columns  # which columns of `matrix` the trees were fitted on
        self._p50 = p50
        self._p90 = p90
        self.shift_p50 = shift_p50  # added to the trees' log-runtime answers (calibration)
        self.shift_p90 = shift_p90
        self._all_columns = bool(np.all(columns))
        if check_rows is None:  # every tenant code and an unknown tenant, nothing else known
            check_rows = np.full((len(tenant_codes) + 1, int(np.count_nonzero(columns))), np.nan)
            check_rows[: len(tenant_codes), 0] = np.arange(len(tenant_codes), dtype=np.float64)
        self._fast = _fast_pair(p50, p90, np.ascontiguousarray(check_rows, dtype=np.float64))

    @property
    def fast(self) -> bool:
        """Whether predictions read the trees directly (False: through scikit-learn's `predict`)."""
        return self._fast is not None

    def matrix(self, tenants: Sequence[str], rows: Sequence[Sequence[float]]) -> FloatArray:
        """All columns: the tenant code (NaN when unknown) then the feature row."""
        return _matrix(self.tenant_codes, tenants, rows)

    def predict_log(self, tenants: Sequence[str], rows: Sequence[Sequence[float]]) -> tuple[FloatArray, FloatArray]:
        x = self.matrix(tenants, rows)
        if x.shape[1] != self.columns.size:  # the fast path does not check what the trees read
            raise ValueError(
                f"feature rows have {x.shape[1] - 1} values; this model was trained on rows of {self.columns.size - 1}"
            )
        x = x if self._all_columns else np.ascontiguousarray(x[:, self.columns])
        if self._fast is not None:
            lo_trees, hi_trees = self._fast
            return lo_trees.predict(x) + self.shift_p50, hi_trees.predict(x) + self.shift_p90
        with threadpool_limits(limits=1):
            lo = np.asarray(self._p50.predict(x), np.float64) + self.shift_p50
            hi = np.asarray(self._p90.predict(x), np.float64) + self.shift_p90
        return lo, hi


class _SummedTrees:
    """A fitted `HistGradientBoostingRegressor` (identity link, one tree per round) as its trees'
    sum, without the checks and the categorical encoder `predict` runs on every call.

    The sum is `predict`'s own: the baseline, then each round's tree added in order, each tree read
    by scikit-learn's `TreePredictor.predict` on one thread. The encoder can be skipped because the
    tenant column already holds what it would output: the codes 0..k-1 are exactly the categories it
    saw (every code occurs in the fitted rows), unknown tenants are NaN. `of` checks that and returns
    None when the regressor's (private) attributes are not laid out as expected.
    """

    def __init__(self, baseline: float, trees: list[Any], known: npt.NDArray[np.uint32], f_idx: npt.NDArray[np.uint32]):
        self.baseline = baseline
        self.trees = trees
        self.known_cat_bitsets = known
        self.f_idx_map = f_idx

    @classmethod
    def of(cls, regressor: HistGradientBoostingRegressor) -> _SummedTrees | None:
        try:
            if regressor.n_trees_per_iteration_ != 1 or type(regressor._loss.link).__name__ != "IdentityLink":
                return None
            categorical = np.asarray(regressor.is_categorical_, dtype=bool)
            if categorical.any():
                # The encoder moves categorical columns first and numbers their categories 0..k-1.
                if list(np.flatnonzero(categorical)) != list(range(int(np.count_nonzero(categorical)))):
                    return None
                encoder = regressor._preprocessor.named_transformers_["encoder"]
                for categories in encoder.categories_:
                    known = np.asarray(categories, dtype=np.float64)
                    known = known[~np.isnan(known)]
                    if not np.array_equal(known, np.arange(known.size, dtype=np.float64)):
                        return None
            elif regressor._preprocessor is not None:
                return None
            baseline = np.asarray(regressor._baseline_prediction, dtype=np.float64).reshape(-1)
            trees = [tree for (tree,) in regressor._predictors]
            known_bitsets, f_idx_map = regressor._bin_mapper.make_known_categories_bitsets()
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            return None
        if baseline.size != 1:
            return None
        return cls(float(baseline[0]), trees, known_bitsets, f_idx_map)

    def predict(self, x: FloatArray) -> FloatArray:
        out = np.zeros(x.shape[0], dtype=np.float64)
        out += self.baseline
        for tree in self.trees:
            out += tree.predict(x, self.known_cat_bitsets, self.f_idx_map, 1)
        return out


def _fast_pair(
    p50: HistGradientBoostingRegressor, p90: HistGradientBoostingRegressor, check_rows: FloatArray
) -> tuple[_SummedTrees, _SummedTrees] | None:
    """Both regressors as `_SummedTrees`, or None unless both give `predict`'s answers bit for bit on
    `check_rows` (any failure means the fast path does not apply to this scikit-learn)."""
    lo, hi = _SummedTrees.of(p50), _SummedTrees.of(p90)
    if lo is None or hi is None:
        return None
    try:
        with threadpool_limits(limits=1):
            for fast, regressor in ((lo, p50), (hi, p90)):
                if not np.array_equal(fast.predict(check_rows), regressor.predict(check_rows), equal_nan=True):
                    return None
    except (AttributeError, IndexError, TypeError, ValueError):
        return None
    return lo, hi


def _matrix(tenant_codes: dict[str, int], tenants: Sequence[str], rows: Sequence[Sequence[float]]) -> FloatArray:
    x = np.empty((len(tenants), 1 + (len(rows[0]) if rows else 0)), dtype=np.float64)
    x[:, 0] = [float(tenant_codes.get(t, math.nan)) for t in tenants]
    if rows:
        x[:, 1:] = np.asarray(rows, dtype=np.float64)
    return x


def _regressor(quantile: float, params: BoostParams, n_columns: int) -> HistGradientBoostingRegressor:
    from sklearn.ensemble import HistGradientBoostingRegressor

    categorical = np.zeros(n_columns, dtype=bool)
    categorical[0] = True
    return HistGradientBoostingRegressor(
        loss="quantile",
        quantile=quantile,
        max_iter=params.max_iter,
        learning_rate=params.learning_rate,
        max_leaf_nodes=params.max_leaf_nodes,
        min_samples_leaf=params.min_samples_leaf,
        categorical_features=categorical,
        early_stopping=False,  # a fixed budget keeps training time predictable and runs reproducible
        random_state=params.random_state,
    )


def train_boosted_quantiles(data: TrainingSet, params: BoostParams | None = None) -> TrainedModel:
    """Fit the p50 and p90 trees on `data` minus its newest `holdout_fraction`, scored on that holdout.

    Raises ValueError on an empty set. The tenant vocabulary is the MAX_TENANT_CODES most frequent
    tenants of the fitted part.
    """
    params = params or BoostParams()
    n = len(data.log_runtimes)
    if n == 0:
        raise ValueError("cannot train on an empty training set")
    n_holdout = int(n * params.holdout_fraction) if n >= 50 else 0
    n_fit = n - n_holdout
    counts: dict[str, int] = {}
    for t in data.tenants[:n_fit]:
        counts[t] = counts.get(t, 0) + 1
    frequent = sorted(counts, key=lambda t: (-counts[t], t))[:MAX_TENANT_CODES]
    codes = {t: i for i, t in enumerate(sorted(frequent))}
    x_all = _matrix(codes, data.tenants, data.rows)
    # A column with no value at all (no limits, no names in this trace) teaches nothing, and
    # scikit-learn's binning rejects it; the tenant column always stays (it is the categorical one).
    columns = ~np.all(np.isnan(x_all[:n_fit]), axis=0)
    columns[0] = True
    x = x_all[:, columns]
    y = np.asarray(data.log_runtimes, dtype=np.float64)
    # One OpenMP thread: on a shared, busy host the default (a thread per core, spin-waiting) was
    # measured 20-30x slower than one thread; a training is a background chore, not a race.
    with threadpool_limits(limits=params.threads):
        p50 = _regressor(0.5, params, x.shape[1]).fit(x[:n_fit], y[:n_fit])
        p90 = _regressor(0.9, params, x.shape[1]).fit(x[:n_fit], y[:n_fit])
    model = BoostedQuantileModel(codes, columns, p50, p90, check_rows=_check_rows(x, n_fit))
    metrics: dict[str, float] = {"n_fit": float(n_fit), "n_holdout": float(n_holdout)}
    if n_holdout:
        lo, hi = model.predict_log(data.tenants[n_fit:], data.rows[n_fit:])
        true_s = np.exp(y[n_fit:])
        errors = runtime_errors(np.exp(lo), true_s)
        # Scores of the uncalibrated trees: the holdout also sets the shifts, so it cannot judge them.
        metrics["holdout_mae_s"] = errors["mae_s"]
        metrics["holdout_within_2x"] = errors["within_2x"]
        metrics["holdout_p90_coverage"] = float(np.mean(true_s <= np.exp(np.maximum(lo, hi))))
        if n_holdout >= params.min_calibration_rows:
            y_holdout = y[n_fit:]
            if params.calibrate_p50:
                model.shift_p50 = float(np.median(y_holdout - lo))
            if params.calibrate_p90:
                level = min(1.0, math.ceil((n_holdout + 1) * 0.9) / n_holdout)
                model.shift_p90 = float(np.quantile(y_holdout - hi, level, method="higher"))
            metrics["shift_p50"], metrics["shift_p90"] = model.shift_p50, model.shift_p90
    return TrainedModel(model=model, metrics=metrics)


def _check_rows(x: FloatArray, n_fit: int, n: int = 128) -> FloatArray:
    """Rows to compare the fast path with `predict` on: the newest fitted and held-out rows as they
    are, again with an unknown tenant, and one row per tenant code with nothing else known."""
    recent = x[max(0, n_fit - n) : n_fit + n]
    unknown = recent.copy()
    unknown[:, 0] = np.nan
    codes = np.unique(x[:n_fit, 0][~np.isnan(x[:n_fit, 0])])
    bare = np.full((codes.size, x.shape[1]), np.nan)
    bare[:, 0] = codes
    return np.ascontiguousarray(np.concatenate([recent, unknown, bare]), dtype=np.float64)
