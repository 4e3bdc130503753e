"""The predictive policy: scale for the load forecast one cold start ahead, never below reactive.

Each call folds the new samples into the seasonal forecast (`forecast`, kept in the memory), then:

    horizon   = deployment.cold_start_s + margin_s       (a replica started now serves by then)
    peak      = the highest forecast request rate over [now, now + horizon]
    peak     *= 1 + recent relative error                (when error_headroom: a margin as wide as
                                                           the forecast has lately been wrong)
    forecast  = ceil(peak / requests_per_s target)
    recommend = max(reactive recommendation, forecast)

and the recommendation goes through the same stabilisation, rate limits and bounds as the reactive
policy (`reactive.settle`). Because that step is monotone in the recommendation and the forecast
only ever raises it, the result is never below what the reactive policy asks for on the same
request. The forecast is left out (the reactive policy decides alone, and the reason says why)
while it is not trusted: less than `min_history_s` of history, or a smoothed or last one-step
error above `max_error` (a burst the season does not know, a shift in the daily shape), or when the
deployment has no requests/s target to turn a rate into replicas.
"""

from __future__ import annotations

import msgspec

from .forecast import distrust, new_forecast, observe, peak_ahead
from .model import PredictiveConfig, ReactiveConfig, ScalingReply, ScalingRequest
from .reactive import ceil_replicas, metric_recommendation, settle


class PredictivePolicy:
    name = "predictive"

    def __init__(self, reactive: ReactiveConfig, predictive: PredictiveConfig) -> None:
        self.reactive = reactive
        self.cfg = predictive

    def decide(self, request: ScalingRequest) -> ScalingReply:
        fc = request.memory.forecast
        if fc is None or fc.step_s != self.cfg.step_s:
            fc = new_forecast(self.cfg)
        fc = observe(fc, request.metrics, self.cfg)
        memory = msgspec.structs.replace(request.memory, forecast=fc)
        raw, why = metric_recommendation(request, self.reactive)

        target = request.deployment.target_of("requests_per_s")
        not_trusted = distrust(fc, self.cfg) if target is not None else "no requests_per_s target to forecast"
        if not_trusted:
            return settle(request, raw, f"{why} (reactive: {not_trusted})", self.reactive, memory)
        assert target is not None
        horizon_s = request.deployment.cold_start_s + self.cfg.margin_s
        peak = peak_ahead(fc, request.now, horizon_s)
        if peak is None:
            return settle(request, raw, f"{why} (reactive: no forecast ahead)", self.reactive, memory)
        if self.cfg.error_headroom:
            peak *= 1.0 + fc.error
        ahead = ceil_replicas(peak / target)
        if ahead > raw:
            why = f"forecast {peak:.3g} requests/s within {horizon_s:g} s at {target:g}/replica -> {ahead}"
            raw = ahead
        return settle(request, raw, why, self.reactive, memory, forecast_requests_per_s=peak)
