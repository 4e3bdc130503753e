"""A seasonal forecast of the request rate: additive Holt-Winters, updated one bucket at a time.

Hand-written on purpose: the pure core takes no numerical dependency (statsmodels is not installed
in this workspace and none may be added), and the online form needs only the last state, not the
whole history, so a decision stays O(season) at worst and O(1) in the common case. Unlike
statsmodels' ExponentialSmoothing it does not fit alpha/beta/gamma by maximum likelihood: they are
fixed in `PredictiveConfig`.

Series: the mean of the `requests_per_s` samples falling in each `step_s` bucket (a sample covers
the interval ending at its `at`, so it belongs to the bucket of `at - 1 us`). Bucket numbers are
absolute (epoch seconds // step), so the season index `slot % season_len` is the time of day.

    init  (after the first season_len buckets): level = their mean, season[i] = x_i - level, trend = 0
    error = |x - (level + trend + season[i])| / max(x, forecast)   (relative one-step error)
    level'  = alpha * (x - season[i]) + (1 - alpha) * (level + trend)
    trend'  = beta * (level' - level) + (1 - beta) * trend
    season[i]' = gamma * (x - level') + (1 - gamma) * season[i]
    forecast(slot + h) = max(0, level + h * trend + season[(slot + h) % season_len])

Outliers (`skip_outliers`): a bucket whose relative error exceeds `max_error` counts in the error
but is not learnt (the model updates as if x were its forecast), so a burst does not lift the
level for the hours after it. Once the outliers have lasted longer than `relearn_after_s` (1 h)
the change is taken as lasting and learnt again. While they last the forecast is not trusted, so
the reactive policy decides. (Robust Holt-Winters, Gelper, Fried and Croux 2010, clips residuals
at k robust standard deviations instead; clipping at the trust band still left the forecast far
above the load for a while after the simulator's 30-minute burst.)

A bucket with no sample (a gap in the metrics) is skipped: the level moves by the trend only.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence

import msgspec

from .model import MetricSample, PredictiveConfig, SeasonalForecast

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_TICK = dt.timedelta(microseconds=1)


def new_forecast(cfg: PredictiveConfig) -> SeasonalForecast:
    season_len = round(cfg.season_s / cfg.step_s)
    if season_len < 2:
        raise ValueError("a season needs at least 2 buckets")
    return SeasonalForecast(step_s=cfg.step_s, season_len=season_len)


def slot_of(at: dt.datetime, step_s: float) -> int:
    """The absolute bucket holding a sample taken at `at` (covering the interval just before it)."""
    return math.floor(((at - _TICK) - _EPOCH).total_seconds() / step_s)


def _fold(fc: SeasonalForecast, slot: int, x: float, cfg: PredictiveConfig) -> SeasonalForecast:
    """Fold the mean of one finished bucket into the model."""
    n = fc.season_len
    if not fc.initialised:
        warmup = [*fc.warmup, x]
        if len(warmup) < n:
            return msgspec.structs.replace(fc, warmup=warmup, slot=slot, buckets_seen=fc.buckets_seen + 1)
        level = sum(warmup) / n
        first = slot - n + 1
        seasonal = [0.0] * n
        for k, v in enumerate(warmup):
            seasonal[(first + k) % n] = v - level
        return msgspec.structs.replace(
            fc, warmup=[], seasonal=seasonal, level=level, trend=0.0, slot=slot, buckets_seen=fc.buckets_seen + 1
        )
    level, trend = fc.level, fc.trend
    if fc.slot is not None and slot > fc.slot + 1:
        level += trend * (slot - fc.slot - 1)
    i = slot % n
    predicted = max(0.0, level + trend + fc.seasonal[i])
    scale = max(x, predicted)
    err = abs(x - predicted) / scale if scale > 0 else 0.0
    error = err if fc.errors_seen == 0 else cfg.error_alpha * err + (1.0 - cfg.error_alpha) * fc.error
    outlier_run = fc.outlier_run + 1 if err > cfg.max_error else 0
    if cfg.skip_outliers and outlier_run and outlier_run * fc.step_s <= cfg.relearn_after_s:
        # a burst is not part of the season: the model does not learn from it (the error still counts)
        x = predicted
    new_level = cfg.alpha * (x - fc.seasonal[i]) + (1.0 - cfg.alpha) * (level + trend)
    new_trend = cfg.beta * (new_level - level) + (1.0 - cfg.beta) * trend
    seasonal = list(fc.seasonal)
    seasonal[i] = cfg.gamma * (x - new_level) + (1.0 - cfg.gamma) * fc.seasonal[i]
    return msgspec.structs.replace(
        fc,
        level=new_level,
        trend=new_trend,
        seasonal=seasonal,
        slot=slot,
        buckets_seen=fc.buckets_seen + 1,
        error=error,
        last_error=err,
        outlier_run=outlier_run,
        errors_seen=fc.errors_seen + 1,
    )


def observe(fc: SeasonalForecast, samples: Sequence[MetricSample], cfg: PredictiveConfig) -> SeasonalForecast:
    """Fold in the samples newer than the last one seen; a bucket is folded once a later one starts.

    Samples must be oldest first; those at or before `last_sample_at` were seen by an earlier call
    (the request's history overlaps from call to call) and are skipped.
    """
    for s in samples:
        if s.requests_per_s is None or (fc.last_sample_at is not None and s.at <= fc.last_sample_at):
            continue
        slot = slot_of(s.at, fc.step_s)
        if fc.pending_slot is not None and slot != fc.pending_slot and fc.pending_count:
            fc = _fold(fc, fc.pending_slot, fc.pending_sum / fc.pending_count, cfg)
            fc = msgspec.structs.replace(fc, pending_sum=0.0, pending_count=0)
        fc = msgspec.structs.replace(
            fc,
            pending_slot=slot,
            pending_sum=fc.pending_sum + s.requests_per_s,
            pending_count=fc.pending_count + 1,
            last_sample_at=s.at,
        )
    return fc


def predict(fc: SeasonalForecast, slot: int) -> float | None:
    """The forecast request rate of an absolute bucket after the last folded one; None before init."""
    if not fc.initialised or fc.slot is None:
        return None
    h = max(1, slot - fc.slot)
    return max(0.0, fc.level + h * fc.trend + fc.seasonal[(fc.slot + h) % fc.season_len])


def peak_ahead(fc: SeasonalForecast, now: dt.datetime, horizon_s: float) -> float | None:
    """The highest forecast over the buckets from the one in progress to the one holding now + horizon."""
    if not fc.initialised or fc.slot is None:
        return None
    first = slot_of(now, fc.step_s)
    last = slot_of(now + dt.timedelta(seconds=horizon_s), fc.step_s)
    values = [
        v for slot in range(max(first, fc.slot + 1), max(first, last) + 1) if (v := predict(fc, slot)) is not None
    ]
    return max(values) if values else None


def history_s(fc: SeasonalForecast) -> float:
    return fc.buckets_seen * fc.step_s


def distrust(fc: SeasonalForecast, cfg: PredictiveConfig) -> str:
    """Why the forecast is not to be trusted yet, or "" when it is."""
    if not fc.initialised:
        return f"forecast not trusted: {history_s(fc):g} s of history, a season needs {cfg.season_s:g} s"
    if history_s(fc) < cfg.min_history_s:
        return f"forecast not trusted: {history_s(fc):g} s of history < {cfg.min_history_s:g} s"
    if fc.error > cfg.max_error:
        return f"forecast not trusted: recent error {fc.error:.0%} > {cfg.max_error:.0%}"
    if fc.last_error > cfg.max_error:
        return f"forecast not trusted: last bucket's error {fc.last_error:.0%} > {cfg.max_error:.0%}"
    return ""
