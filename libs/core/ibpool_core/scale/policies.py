"""The scaling policies by name, and `decide`, the one entry point.

Contract of a policy: `decide(request) -> reply` is pure (no I/O, no clock but `request.now`), reads
only the request (its memory included) and returns everything the next call needs in
`reply.memory`. It must keep `reply.desired_replicas` within the deployment's bounds (or 0 when
scaled to zero), `add` = max(0, desired - current) and `remove` = that many existing replica ids.

| name       | recommendation                                            | module     |
|------------|-----------------------------------------------------------|------------|
| reactive   | the HPA formula on the current metrics                    | reactive   |
| predictive | max(reactive, seasonal forecast one cold start ahead)     | predictive |

Both share the stabilisation windows, rate limits, bounds and scale to zero of `reactive.settle`.
`register(name, factory)` adds a policy; a factory takes the `PolicyConfig`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from .model import PolicyConfig, ScalingReply, ScalingRequest
from .predictive import PredictivePolicy
from .reactive import ReactivePolicy


class ScalingPolicy(Protocol):
    name: str

    def decide(self, request: ScalingRequest) -> ScalingReply: ...


PolicyFactory = Callable[[PolicyConfig], ScalingPolicy]

POLICIES: dict[str, PolicyFactory] = {
    "reactive": lambda cfg: ReactivePolicy(cfg.reactive),
    "predictive": lambda cfg: PredictivePolicy(cfg.reactive, cfg.predictive),
}


def register(name: str, factory: PolicyFactory) -> None:
    POLICIES[name] = factory


def make_policy(cfg: PolicyConfig) -> ScalingPolicy:
    try:
        factory = POLICIES[cfg.name]
    except KeyError:
        raise ValueError(f"unknown scaling policy {cfg.name!r}; known: {', '.join(sorted(POLICIES))}") from None
    return factory(cfg)


def decide(request: ScalingRequest) -> ScalingReply:
    """The scaling decision for one deployment, by the policy the request names."""
    return make_policy(request.policy).decide(request)
