"""The seasonal forecast and the predictive policy: ahead of a known rise, reactive when not trusted."""

from __future__ import annotations

import datetime as dt

import msgspec
import pytest

from ibpool_core.scale.forecast import distrust, new_forecast, observe, peak_ahead, predict, slot_of
from ibpool_core.scale.model import (
    Deployment,
    MetricSample,
    MetricTarget,
    PolicyConfig,
    PredictiveConfig,
    Replica,
    ScalerMemory,
    ScalingReply,
    ScalingRequest,
    SeasonalForecast,
)
from ibpool_core.scale.policies import decide

T0 = dt.datetime(2026, 1, 5, 0, 0, tzinfo=dt.UTC)
# An hourly season of 1-minute buckets keeps the tests small; the production default is daily, 5-minute.
CFG = PredictiveConfig(step_s=60.0, season_s=3600.0, min_history_s=3600.0 + 600.0, margin_s=120.0, error_headroom=False)
DEP = Deployment(
    name="chat",
    min_replicas=1,
    max_replicas=100,
    targets=[MetricTarget(metric="requests_per_s", value=10.0)],
    cold_start_s=120.0,
)


def hourly_rise(minute: int) -> float:
    """10 requests/s for the first half of every hour, 100 for the second."""
    return 10.0 if minute % 60 < 30 else 100.0


def history(minutes: int, rate: object = hourly_rise, every_s: float = 15.0) -> list[MetricSample]:
    """Samples every `every_s` from T0 for `minutes` minutes; the rate of each comes from its minute."""
    n = int(minutes * 60 / every_s)
    out = []
    for k in range(1, n + 1):
        at = T0 + dt.timedelta(seconds=k * every_s)
        minute = int((k * every_s - 1e-6) // 60)
        out.append(MetricSample(at=at, requests_per_s=rate(minute)))  # type: ignore[operator]
    return out


def trained(minutes: int, rate: object = hourly_rise) -> tuple[SeasonalForecast, list[MetricSample]]:
    samples = history(minutes, rate)
    return observe(new_forecast(CFG), samples, CFG), samples


def ask(policy: str, samples: list[MetricSample], ready: int, memory: ScalerMemory) -> ScalingReply:
    now = samples[-1].at
    reps = [Replica(replica_id=f"r{i}", state="ready", since=T0) for i in range(ready)]
    request = ScalingRequest(
        deployment=DEP,
        replicas=reps,
        metrics=samples[-8:],
        now=now,
        policy=PolicyConfig(name=policy, predictive=CFG),
        memory=memory,
    )
    return decide(request)


def test_holt_winters_learns_an_exact_season() -> None:
    fc, _ = trained(180)
    assert fc.initialised and fc.buckets_seen == 179  # the bucket in progress is not folded yet
    # the next hour, minute by minute, as the season says
    base = int(T0.timestamp() // CFG.step_s) + 180
    for m in range(60):
        assert predict(fc, base + m) == pytest.approx(hourly_rise(m), abs=0.5)
    assert fc.error == pytest.approx(0.0, abs=1e-6)


def test_samples_already_seen_are_not_counted_twice() -> None:
    samples = history(90)
    once = observe(new_forecast(CFG), samples, CFG)
    twice = observe(once, samples[-20:], CFG)
    assert twice == once


def test_peak_ahead_sees_the_rise_one_cold_start_away() -> None:
    fc, samples = trained(147)  # minute 27 of the third hour; the rise comes at minute 30
    now = samples[-1].at
    assert slot_of(now, CFG.step_s) == fc.slot + 1  # the last minute is still in progress
    assert peak_ahead(fc, now, 60.0) == pytest.approx(10.0, abs=0.5)  # not within a minute
    assert peak_ahead(fc, now, 240.0) == pytest.approx(100.0, abs=0.5)  # within four


def test_predictive_scales_ahead_of_a_known_seasonal_rise() -> None:
    fc, samples = trained(147)
    memory = ScalerMemory(forecast=fc)
    reactive = ask("reactive", samples, 2, memory)
    predictive = ask("predictive", samples, 2, memory)
    # load is 10/s now, 1 replica is enough; the rise to 100/s is 3 minutes away, inside cold start + margin (4)
    assert reactive.desired_replicas == 1
    assert predictive.recommended == 10
    assert predictive.desired_replicas == 6  # +4 per 15 s from 2
    assert "forecast 100" in predictive.reason
    assert predictive.forecast_requests_per_s == pytest.approx(100.0, abs=0.5)


def test_predictive_falls_back_to_reactive_with_short_history() -> None:
    fc, samples = trained(57)  # less than one season
    memory = ScalerMemory(forecast=fc)
    predictive = ask("predictive", samples, 4, memory)
    reactive = ask("reactive", samples, 4, memory)
    assert predictive.desired_replicas == reactive.desired_replicas == 8  # 100/s asks 10, +100% per 15 s
    assert "forecast not trusted" in predictive.reason
    fc_long, _ = trained(65)  # one season learned, but min_history_s (70 min) not reached
    assert "history" in distrust(fc_long, CFG)


def test_predictive_falls_back_to_reactive_when_the_forecast_was_wrong_lately() -> None:
    def shifted(minute: int) -> float:
        # the last minutes do not follow the season (a burst to 50/s where it says 10/s)
        return 50.0 if minute >= 141 else hourly_rise(minute)

    fc, samples = trained(147, shifted)
    assert "recent error" in distrust(fc, CFG)
    memory = ScalerMemory(forecast=fc)
    predictive = ask("predictive", samples, 5, memory)
    reactive = ask("reactive", samples, 5, memory)
    assert predictive.desired_replicas == reactive.desired_replicas == 5
    assert "recent error" in predictive.reason


@pytest.mark.parametrize("minute", [25, 40, 57, 88, 100, 147, 160, 175])
def test_predictive_is_never_below_reactive(minute: int) -> None:
    fc, samples = trained(minute)
    # the forecast state is shared, so both policies see the same memory
    memory = ScalerMemory(forecast=fc)
    for ready in (1, 4, 12):
        reactive = ask("reactive", samples, ready, memory)
        predictive = ask("predictive", samples, ready, memory)
        assert predictive.desired_replicas >= reactive.desired_replicas, (minute, ready, predictive.reason)


def test_predictive_does_not_keep_replicas_for_a_forecast_fall() -> None:
    # minute 57: load is 100/s now, the season says it falls to 10/s at the top of the hour
    fc, samples = trained(177)
    predictive = ask("predictive", samples, 10, ScalerMemory(forecast=fc))
    assert predictive.desired_replicas == 10


def test_the_forecast_rides_in_the_memory_from_call_to_call() -> None:
    samples = history(20)
    memory = ScalerMemory()
    for k in range(4, len(samples) + 1, 4):
        memory = ask("predictive", samples[:k], 2, memory).memory
    assert memory.forecast is not None
    assert memory.forecast == observe(new_forecast(CFG), samples, CFG)


def test_a_changed_step_starts_a_fresh_forecast() -> None:
    fc, samples = trained(30)
    other = msgspec.structs.replace(fc, step_s=300.0)
    reply = ask("predictive", samples, 2, ScalerMemory(forecast=other))
    assert reply.memory.forecast is not None and reply.memory.forecast.step_s == CFG.step_s


def test_one_bucket_far_off_the_forecast_is_enough_to_distrust_it() -> None:
    def one_burst(minute: int) -> float:
        return 40.0 if minute == 145 else hourly_rise(minute)

    fc, _ = trained(147, one_burst)  # minute 145 is the last folded bucket
    assert fc.error <= CFG.max_error < fc.last_error
    assert "last bucket's error" in distrust(fc, CFG)


def test_a_burst_is_not_learnt() -> None:
    def burst(minute: int) -> float:
        return 400.0 if 135 <= minute < 140 else hourly_rise(minute)

    fc, _ = trained(147, burst)
    base = int(T0.timestamp() // CFG.step_s)
    # after five minutes at 4x, the model still expects the season
    assert predict(fc, base + 147) == pytest.approx(10.0, abs=1.0)
    assert predict(fc, base + 150) == pytest.approx(100.0, abs=5.0)
    no_skip = msgspec.structs.replace(CFG, skip_outliers=False)
    learnt = observe(new_forecast(no_skip), history(147, burst), no_skip)
    prediction = predict(learnt, base + 147)
    assert prediction is not None and prediction > 30.0


def test_a_lasting_shift_is_learnt_after_the_relearn_window() -> None:
    cfg = msgspec.structs.replace(CFG, relearn_after_s=600.0)

    def doubled(minute: int) -> float:
        return 2.0 * hourly_rise(minute) if minute >= 120 else hourly_rise(minute)

    fc = observe(new_forecast(cfg), history(175, doubled), cfg)
    base = int(T0.timestamp() // cfg.step_s)
    prediction = predict(fc, base + 175)  # minute 55: 200/s in the doubled world, 100/s in the old one
    assert prediction is not None and prediction > 150.0
