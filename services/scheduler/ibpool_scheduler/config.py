"""Scheduler configuration (env `IBPOOL_SCHEDULER_<FIELD>` or TOML `[scheduler]`)."""

from __future__ import annotations

from typing import Literal

from ibpool_runtime.config import BaseConfig


class SchedulerConfig(BaseConfig, frozen=True, kw_only=True):
    # The queue set this scheduler serves; jobs of other queues are refused. Empty: every queue.
    queues: list[str] = []
    # Fencing group at the pool allocator: the replicas of one scheduler share it, other schedulers
    # (inference, another queue set) use their own. Empty: the leader key (one group per election).
    scheduler_group: str = ""
    # Queue policy (ibpool_core.sched.queueing.POLICIES): fifo, sjf, priority, predictive, las,
    # tiresias, gittins, dynamic. An unknown name stops the service at start.
    policy: str = "priority"
    backfill: Literal["none", "greedy", "easy"] = "easy"
    # Queue positions examined per cycle.
    scan_depth: int = 128
    # A cycle runs this often, and soon after a job arrives or capacity frees up.
    cycle_interval_s: float = 1.0
    # Wait this long after a wake-up before deciding, so that a burst of submissions is one cycle.
    cycle_debounce_s: float = 0.02
    # Lease of every proposed allocation; the leader renews leases when half of it is left.
    lease_s: float = 300.0
    # After an `over_quota` or `invalid` rejection the job waits this long before it is placed again.
    retry_after_s: float = 5.0
    # A job requeued this many times (hardware failures, lost leases) ends as failed.
    max_attempts: int = 10
    # Gangs: the node label naming a node's leaf switch (unlabelled nodes share one leaf group).
    leaf_label: str = "ibpool.io/leaf"
    # Gangs with topology "preferred" may span more leaves than the minimum after waiting this long.
    span_relax_after_s: float = 600.0
    leader_election: bool = True
    leader_key: str = "scheduler"
    leader_ttl_s: float = 5.0
    # Durable consumer names start with this (-jobs, -pool, -health); the pool view reads ephemerally.
    durable_prefix: str = "scheduler"
