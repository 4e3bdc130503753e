"""Scale domain: the autoscaler's decisions about inference deployments."""

from __future__ import annotations

from typing import ClassVar

from .message import Event


class ScaleDecided(Event, frozen=True, kw_only=True, tag="io.ibpool.scale.deployment.decided.v1"):
    key_name: ClassVar[str] = "deployment"
    summary: ClassVar[str] = "The autoscaler chose a new replica target for a deployment."

    deployment: str
    current_replicas: int
    target_replicas: int
    reason: str
