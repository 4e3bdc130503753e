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


class DeploymentMetricsReported(Event, frozen=True, kw_only=True, tag="io.ibpool.scale.deployment.metrics.v1"):
    key_name: ClassVar[str] = "deployment"
    summary: ClassVar[str] = (
        "Whatever serves a deployment (an ingress, a load generator) reports its load over the last interval."
    )

    deployment: str
    # None: not measured by this reporter. Rates and lengths are the deployment's totals, not per replica.
    requests_per_s: float | None = None
    queue_length: float | None = None
    p99_latency_ms: float | None = None
    # Mean over the serving replicas, 0..1.
    gpu_utilization: float | None = None


class ElasticJobResized(Event, frozen=True, kw_only=True, tag="io.ibpool.scale.elastic.resized.v1"):
    key_name: ClassVar[str] = "elastic_job"
    summary: ClassVar[str] = (
        "The autoscaler grew an elastic training job into idle GPUs or shrank it for higher-priority work."
    )

    elastic_job: str
    workers_from: int
    workers_to: int
    reason: str
    # Worker jobs submitted to the scheduler and cancelled there by this resize.
    submitted: list[str] = []
    cancelled: list[str] = []
