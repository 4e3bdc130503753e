"""Failover controller configuration (env `IBPOOL_FAILOVER_CONTROLLER_<FIELD>` or TOML `[failover_controller]`)."""

from __future__ import annotations

from ibpool_core.health.decide import FailoverConfig
from ibpool_core.health.gpu_signals import GpuRules
from ibpool_core.health.heartbeat import HeartbeatRules
from ibpool_core.health.job_exits import RetryRules
from ibpool_runtime.config import BaseConfig


class FailoverControllerConfig(BaseConfig, frozen=True, kw_only=True):
    # How often the verdicts are judged against the clock (missing heartbeats are seen only so).
    tick_interval_s: float = 0.25
    # Heartbeats: suspected after this many intervals without one, failed after fail_after_s.
    suspect_after_intervals: float = 2.5
    fail_after_s: float = 3.0
    # A suspected node is cleared after this many intervals of heartbeats on time.
    clear_after_beats: int = 3
    # NATS URL of a user of nats-server's system account, to read its client connect/disconnect
    # advisories: an agent whose last connection closes has its nodes failed after reconnect_grace_s
    # unless it connects again. Empty: agents' deaths are seen through missing heartbeats only.
    connection_events_url: str = ""
    reconnect_grace_s: float = 1.0
    # A failed node (or cordoned GPU) must look healthy this long before it is put back;
    # doubled for each failure within flap_memory_s, at most max_hold_s.
    stable_window_s: float = 30.0
    max_hold_s: float = 3600.0
    flap_memory_s: float = 3600.0
    # Split-brain guard: never more failed nodes than max(min_failed_allowed, fraction * nodes).
    max_failed_fraction: float = 0.2
    min_failed_allowed: int = 1
    # Cordon a host rail / leaf for degraded links (errors, width, speed), not only down and flapping.
    cordon_degraded_links: bool = True
    # GPU thresholds.
    ecc_volatile_cordon: int = 1
    ecc_aggregate_fail: int = 100
    retired_pages_fail: int = 60
    temp_cordon_c: float = 90.0
    temp_fail_c: float = 100.0
    # Jobs hit by hardware: retry backoff (none after the first hit, then doubling from
    # requeue_backoff_s), flag and requeue limits.
    requeue_backoff_s: float = 1.0
    requeue_backoff_max_s: float = 300.0
    flag_after_failures: int = 3
    max_requeues: int = 5
    # XID codes reclassified, e.g. "13=gpu_reset,31=none" (none, application, gpu_reset, node_reboot).
    xid_overrides: str = ""
    # Durable consumer names start with this.
    durable_prefix: str = "failover-controller"
    # The subject key of cluster-wide events (ClusterDegraded, ClusterRestored).
    cluster: str = "cluster"
    # Verdict events kept for GET /health/verdicts.
    verdict_history: int = 10_000
    # Seconds allowed for fetching a published topology from the fabric monitor.
    topology_fetch_timeout_s: float = 10.0
    # Replicas elect the one that decides over NATS KV (bucket ibpool_leaders, this key); a leader
    # that stops renewing for leader_ttl_s is replaced. Off: whoever holds the Postgres lock decides.
    leader_election: bool = True
    leader_key: str = "failover_controller"
    leader_ttl_s: float = 5.0
    # With API tokens, only operators may take the actions under /health/nodes (recover, drain).
    api_operator_paths: str = "/v1/quotas,/v1/sim,/health/nodes"


XID_ACTIONS = ("none", "application", "gpu_reset", "node_reboot")


def parse_xid_overrides(text: str) -> dict[int, str]:
    """`"13=gpu_reset, 31=none"` -> {13: "gpu_reset", 31: "none"}; ValueError naming the bad item."""
    out: dict[int, str] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        code, sep, action = item.partition("=")
        if not sep or not code.strip().isdigit() or action.strip() not in XID_ACTIONS:
            raise ValueError(f"xid_overrides item {item!r} is not <code>=<{'|'.join(XID_ACTIONS)}>")
        out[int(code)] = action.strip()
    return out


def core_config(cfg: FailoverControllerConfig, source: str) -> FailoverConfig:
    """The pure decision's config from the service's flat one (ValueError on bad xid_overrides)."""
    return FailoverConfig(
        source=source,
        cluster=cfg.cluster,
        heartbeat=HeartbeatRules(
            suspect_after_intervals=cfg.suspect_after_intervals,
            fail_after_s=cfg.fail_after_s,
            clear_after_beats=cfg.clear_after_beats,
            reconnect_grace_s=cfg.reconnect_grace_s,
        ),
        gpu=GpuRules(
            ecc_volatile_cordon=cfg.ecc_volatile_cordon,
            ecc_aggregate_fail=cfg.ecc_aggregate_fail,
            retired_pages_fail=cfg.retired_pages_fail,
            temp_cordon_c=cfg.temp_cordon_c,
            temp_fail_c=cfg.temp_fail_c,
        ),
        retry=RetryRules(
            requeue_backoff_s=cfg.requeue_backoff_s,
            requeue_backoff_max_s=cfg.requeue_backoff_max_s,
            flag_after_failures=cfg.flag_after_failures,
            max_requeues=cfg.max_requeues,
        ),
        xid_overrides=parse_xid_overrides(cfg.xid_overrides),  # type: ignore[arg-type]
        stable_window_s=cfg.stable_window_s,
        max_hold_s=cfg.max_hold_s,
        flap_memory_s=cfg.flap_memory_s,
        max_failed_fraction=cfg.max_failed_fraction,
        min_failed_allowed=cfg.min_failed_allowed,
        cordon_degraded_links=cfg.cordon_degraded_links,
    )
