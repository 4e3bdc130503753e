"""The reactive policy: the Kubernetes HPA formula, its stabilisation windows and rate limits.

For each target, from the metric averaged over `metric_window_s` and the ready replicas only (a
starting replica serves nothing yet, so it is neither measured nor counted as capacity):

    ratio   = metric per ready replica / target            (average values: requests/s, queue)
            = metric / target                              (utilisations: GPU, p99 latency)
    desired = ceil(ready * ratio)                          (= ceil(total / target) for average values)
    if |ratio - 1| <= tolerance: desired = current (ready + starting)

The recommendation is the largest over the targets. With no ready replica, an average value still
gives ceil(total / target) (this is how a deployment wakes up); a utilisation gives nothing.

`settle` turns a recommendation into a decision, in this order (shared with `predictive`):

1. Scale to zero: a deployment that may scale to zero and saw no traffic (no requests, no queue)
   in any sample of the last `idle_window_s` (the history must reach back that far) goes to 0 at
   once; rate limits do not apply (there is no load to protect). At 0 it stays there until a
   sample shows traffic.
2. Stabilisation (HPA's behaviour): up = min of the recommendations in the scale-up window, down =
   max of those in the scale-down window (both include this one); current < up -> up, current >
   down -> down, else keep current. A dip shorter than the down window never removes a replica.
3. Rate limits: a scale-up stops at max(ceil(start * (1 + up%)), start + up_replicas), where start
   is the count before the additions of the last `up_period_s`; a scale-down at min(floor(start * (1
   - down%)), start - down_replicas), start being the count before the removals of the last
   `down_period_s`.
4. Bounds: [max(min_replicas, 1), max_replicas] (the floor is 0 only while scaled to zero); the
   bounds win over the rate limits.

Removed replicas are the starting ones first (they serve nothing yet), then the newest ready ones.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence

import msgspec

from .model import (
    AVERAGE_VALUE_METRICS,
    MetricSample,
    ReactiveConfig,
    Recommendation,
    Replica,
    ScaleChange,
    ScalerMemory,
    ScalingReply,
    ScalingRequest,
)

# Keeps ceil() from adding a replica for a ratio that is 1.0 up to float noise.
_EPS = 1e-9


def ceil_replicas(x: float) -> int:
    return max(0, math.ceil(x - _EPS))


def window(samples: Sequence[MetricSample], now: dt.datetime, seconds: float) -> list[MetricSample]:
    """The samples of the last `seconds` (at > now - seconds and at <= now); the latest one if none is."""
    cutoff = now - dt.timedelta(seconds=seconds)
    inside = [s for s in samples if cutoff < s.at <= now]
    if inside:
        return inside
    past = [s for s in samples if s.at <= now]
    return past[-1:]


def has_traffic(sample: MetricSample) -> bool:
    return bool(sample.requests_per_s) or bool(sample.queue_length)


def idle_for_window(request: ScalingRequest) -> bool:
    """No traffic in any sample of the last idle window, and the history reaches back that far."""
    cutoff = request.now - dt.timedelta(seconds=request.deployment.idle_window_s)
    past = [s for s in request.metrics if s.at <= request.now]
    if not past or past[0].at > cutoff:
        return False
    return not any(has_traffic(s) for s in past if s.at > cutoff)


def metric_recommendation(request: ScalingRequest, cfg: ReactiveConfig) -> tuple[int, str]:
    """The HPA formula over every target (the largest wins) and a sentence saying why."""
    ready, current = request.ready, request.current
    recent = window(request.metrics, request.now, cfg.metric_window_s)
    best: int | None = None
    why = ""
    for target in request.deployment.targets:
        values = [v for s in recent if (v := getattr(s, target.metric)) is not None]
        if not values:
            continue
        value = sum(values) / len(values)
        if target.metric in AVERAGE_VALUE_METRICS:
            if ready == 0:
                want, text = ceil_replicas(value / target.value), f"{target.metric} {value:.3g} with no ready replica"
            else:
                ratio = value / ready / target.value
                if abs(ratio - 1.0) <= cfg.tolerance + _EPS:
                    want, text = current, f"{target.metric} {value:.3g} within tolerance of {target.value:g}/replica"
                else:
                    want = ceil_replicas(value / target.value)
                    text = f"{target.metric} {value:.3g} at {target.value:g}/replica"
        else:
            if ready == 0:
                continue
            ratio = value / target.value
            if abs(ratio - 1.0) <= cfg.tolerance + _EPS:
                want, text = current, f"{target.metric} {value:.3g} within tolerance of {target.value:g}"
            else:
                want = ceil_replicas(ready * ratio)
                text = f"{target.metric} {value:.3g} vs target {target.value:g} on {ready} ready"
        if best is None or want > best:
            best, why = want, f"{text} -> {want}"
    if best is None:
        return current, f"no metric to act on -> keep {current}"
    return best, why


def _stabilise(
    recommendations: Sequence[Recommendation], now: dt.datetime, raw: int, current: int, cfg: ReactiveConfig
) -> tuple[int, str]:
    up_cut = now - dt.timedelta(seconds=cfg.scale_up_window_s)
    down_cut = now - dt.timedelta(seconds=cfg.scale_down_window_s)
    up = min([raw, *(r.replicas for r in recommendations if r.at > up_cut)])
    down = max([raw, *(r.replicas for r in recommendations if r.at > down_cut)])
    if current < up:
        return up, "" if up == raw else f"; scale-up window holds {up}"
    if current > down:
        return down, "" if down == raw else f"; scale-down window holds {down}"
    if raw != current:
        return current, f"; stabilisation window holds {current}"
    return current, ""


def _rate_limit(
    changes: Sequence[ScaleChange], now: dt.datetime, desired: int, current: int, cfg: ReactiveConfig
) -> tuple[int, str]:
    if desired > current:
        cut = now - dt.timedelta(seconds=cfg.up_period_s)
        start = current - sum(c.delta for c in changes if c.at > cut and c.delta > 0)
        limit = max(ceil_replicas(start * (1.0 + cfg.up_percent / 100.0)), start + cfg.up_replicas)
        if desired > limit:
            capped = max(current, limit)
            return capped, f"; scale-up rate limit {capped}"
    elif desired < current:
        cut = now - dt.timedelta(seconds=cfg.down_period_s)
        start = current - sum(c.delta for c in changes if c.at > cut and c.delta < 0)
        limit = min(math.floor(start * (1.0 - cfg.down_percent / 100.0) + _EPS), start - cfg.down_replicas)
        if desired < limit:
            capped = min(current, limit)
            return capped, f"; scale-down rate limit {capped}"
    return desired, ""


def replicas_to_remove(replicas: Sequence[Replica], count: int) -> list[str]:
    """Starting replicas first (they serve nothing yet), newest first; then the newest ready ones."""
    ordered = sorted(replicas, key=lambda r: (r.state != "starting", -r.since.timestamp(), r.replica_id))
    return [r.replica_id for r in ordered[:count]]


def _remember(
    memory: ScalerMemory, now: dt.datetime, raw: int, delta: int, cfg: ReactiveConfig, forget_recommendations: bool
) -> ScalerMemory:
    keep_s = max(cfg.scale_down_window_s, cfg.scale_up_window_s)
    rec_cut = now - dt.timedelta(seconds=keep_s)
    recs = [] if forget_recommendations else [r for r in memory.recommendations if r.at > rec_cut]
    recs.append(Recommendation(at=now, replicas=raw))
    change_cut = now - dt.timedelta(seconds=max(cfg.up_period_s, cfg.down_period_s))
    changes = [c for c in memory.changes if c.at > change_cut]
    if delta:
        changes.append(ScaleChange(at=now, delta=delta))
    return msgspec.structs.replace(memory, recommendations=recs, changes=changes)


def settle(
    request: ScalingRequest,
    raw: int,
    why: str,
    cfg: ReactiveConfig,
    memory: ScalerMemory | None = None,
    forecast_requests_per_s: float | None = None,
) -> ScalingReply:
    """Scale to zero, stabilisation, rate limits and bounds applied to the recommendation `raw`.

    Monotone in `raw` for a given request and memory: a larger recommendation never yields fewer
    replicas, which is what lets the predictive policy promise never to go below the reactive one.
    """
    dep, now, current = request.deployment, request.now, request.current
    memory = request.memory if memory is None else memory
    latest = [s for s in request.metrics if s.at <= now][-1:]
    traffic_now = bool(latest) and has_traffic(latest[0])

    if dep.may_scale_to_zero and current > 0 and idle_for_window(request):
        reason = f"idle for {dep.idle_window_s:g} s -> scale to zero"
        return ScalingReply(
            desired_replicas=0,
            reason=reason,
            remove=replicas_to_remove(request.replicas, current),
            memory=_remember(memory, now, 0, -current, cfg, forget_recommendations=True),
            recommended=raw,
            forecast_requests_per_s=forecast_requests_per_s,
        )
    if dep.may_scale_to_zero and current == 0 and not traffic_now:
        return ScalingReply(
            desired_replicas=0,
            reason="scaled to zero, no traffic",
            memory=_remember(memory, now, 0, 0, cfg, forget_recommendations=True),
            recommended=0,
            forecast_requests_per_s=forecast_requests_per_s,
        )

    floor = max(dep.min_replicas, 1)
    reason = why + (" (wake-up)" if current == 0 else "")
    desired, note = _stabilise(memory.recommendations, now, raw, current, cfg)
    reason += note
    desired, note = _rate_limit(memory.changes, now, desired, current, cfg)
    reason += note
    if desired < floor:
        desired, reason = floor, reason + f"; min {floor}"
    elif desired > dep.max_replicas:
        desired, reason = dep.max_replicas, reason + f"; max {dep.max_replicas}"
    delta = desired - current
    return ScalingReply(
        desired_replicas=desired,
        reason=reason,
        add=max(0, delta),
        remove=replicas_to_remove(request.replicas, -delta) if delta < 0 else [],
        memory=_remember(memory, now, raw, delta, cfg, forget_recommendations=False),
        recommended=raw,
        forecast_requests_per_s=forecast_requests_per_s,
    )


class ReactivePolicy:
    """Scales on the metrics as they are now (the HPA)."""

    name = "reactive"

    def __init__(self, cfg: ReactiveConfig) -> None:
        self.cfg = cfg

    def decide(self, request: ScalingRequest) -> ScalingReply:
        raw, why = metric_recommendation(request, self.cfg)
        return settle(request, raw, why, self.cfg)
