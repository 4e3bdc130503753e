"""Autoscaler configuration (env `IBPOOL_AUTOSCALER_<FIELD>` or TOML `[autoscaler]`)."""

from __future__ import annotations

from ibpool_runtime.config import BaseConfig


class AutoscalerConfig(BaseConfig, frozen=True, kw_only=True):
    # One decision per deployment this often (the HPA's default sync period).
    interval_s: float = 15.0
    # Metric samples older than this are dropped; it must cover a deployment's metric window and, for
    # scale to zero, its idle window (the defaults: 60 s and 900 s).
    metric_retention_s: float = 1800.0
    # A replica (or elastic worker) job without a workload of its own runs this long in the simulated
    # launcher (30 days): it serves until the autoscaler cancels it.
    replica_runtime_s: float = 30 * 86400.0
    leader_election: bool = True
    leader_key: str = "autoscaler"
    leader_ttl_s: float = 5.0
    # Durable consumer names start with this (-jobs, -metrics).
    durable_prefix: str = "autoscaler"
