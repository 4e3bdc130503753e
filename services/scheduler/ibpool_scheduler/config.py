"""Scheduler configuration (env `IBPOOL_SCHEDULER_<FIELD>` or TOML `[scheduler]`)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ibpool_core.sched.sharp import SharpLimits
from ibpool_runtime.config import BaseConfig
from ibpool_runtime.fabric_feed import FabricFormat


class QueueConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One queue's policy (a name of `ibpool_core.sched.queueing.POLICIES`) and backfill; a field
    left out takes the scheduler-wide `policy` / `backfill`."""

    policy: str | None = None
    backfill: Literal["none", "greedy", "easy"] | None = None


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
    # Per queue: its own policy and backfill (TOML `[scheduler.queue_policies.<queue>]`); queues
    # not named here use `policy` and `backfill`. An unknown policy name stops the service at start.
    queue_policies: dict[str, QueueConfig] = {}
    # Placement: "framework" runs the placement plugins (`ibpool_core.sched.framework`, profile
    # below); "leaf" the core's plain `LeafPlacer` (best fit, gangs on the fewest leaves).
    placement: Literal["framework", "leaf"] = "framework"
    # The framework's profile (`ibpool_core.sched.framework.ProfileConfig` fields: plugins per point,
    # score weights, plugin args), merged over the scheduler's default profile (see the README).
    placement_profile: dict[str, Any] = {}
    # A single-host job is scored on at most this many hosts (the fullest that fit, plus the holders
    # of its dataset); 0: every host. Bounds a cycle's cost on a large cluster.
    placement_sample: int = 16
    # The dataset registry: dataset -> node ids holding a copy (more entries: PUT /v1/datasets/{name}).
    datasets: dict[str, list[str]] = {}
    # Node label whose value "true" marks a node under a SHARP-capable leaf switch (no fabric known).
    sharp_label: str = "ibpool.io/sharp"
    # How many SHARP streaming-aggregation trees the fabric runs at once (`ibpool_core.sched.sharp.
    # SharpLimits`: per "link" (Quantum-2: one tree per port) or per "switch" (Quantum HDR: one per
    # switch), and at most `max_trees` in the subnet (Quantum-2: 511)); TOML [scheduler.sharp_limits].
    sharp_limits: SharpLimits = SharpLimits()
    # Telemetry older than this is ignored (the node reads as idle and cool).
    telemetry_max_age_s: float = 120.0
    # Fair share per tenant (`ibpool_core.sched.fairshare`): usage decays with this half-life;
    # `fairshare_shares` gives tenants unequal shares (absent tenants: 1). Read by the priority policy.
    fairshare_half_life_s: float = 7 * 86_400.0
    fairshare_shares: dict[str, float] = {}
    # Queue positions examined per cycle.
    scan_depth: int = 128
    # A cycle runs this often, and soon after a job arrives or capacity frees up.
    cycle_interval_s: float = 1.0
    # Wait this long after a wake-up before deciding, so that a burst of submissions is one cycle.
    cycle_debounce_s: float = 0.02
    # The consumers whose news the leader's cycle handles in its own transaction ("jobs": submissions,
    # cancellations, starts, exits; "pool": the allocator's answers; "health": requeue requests): a
    # submission is stored and planned in one commit. The others' news is stored by a transaction
    # of its own first, and a cycle after it plans with it.
    cycle_takes_news: list[str] = msgspec.field(default_factory=lambda: ["jobs"])
    # Lease of every proposed allocation; the leader renews leases when half of it is left.
    lease_s: float = 300.0
    # Send a cycle's proposals as one ProposePlacements command (off: one ProposePlacement each).
    batch_proposals: bool = True
    # After an `over_quota` or `invalid` rejection the job waits this long before it is placed again.
    retry_after_s: float = 5.0
    # A job requeued this many times (hardware failures, lost leases) ends as failed.
    max_attempts: int = 10
    # The fabric placement decides on is the fabric monitor's published topology, followed live
    # (fetched within this time). `fabric_file`: a topology file in any format `ibpool topo convert`
    # reads ("auto": guessed), in force until a topology is published (clusters without a fabric
    # monitor). With neither, the node label `leaf_label` names a node's leaf switch (unlabelled
    # nodes share one leaf group) and `sharp_label` = "true" marks it under a SHARP-capable leaf.
    fabric_fetch_timeout_s: float = 10.0
    fabric_file: str = ""
    fabric_format: FabricFormat = "auto"
    leaf_label: str = "ibpool.io/leaf"
    # Multi-site: the node label naming a node's site, and what running a job at a site without a
    # copy of its dataset costs it (copying the data), in the choice of its site.
    site_label: str = "ibpool.io/site"
    site_transfer_s: float = 600.0
    # Gangs with topology "preferred" may span more leaves than the minimum after waiting this long.
    span_relax_after_s: float = 600.0
    # The learned runtime model (ibpool_scheduler.predictor, README "Runtime prediction"): on, every
    # queued job gets p50/p90 predictions (read by sjf, predictive, dynamic and EASY backfill) and
    # gittins-learned reads the runtimes of ended jobs; off, they plan with requested limits only.
    predict_runtime: bool = True
    # A background training starts once this many more ended jobs were learned from...
    predict_retrain_every: int = 500
    # ...and only with at least this many in the window (before that the per-tenant median serves).
    predict_min_train_rows: int = 200
    # The newest ended jobs kept as training rows; also how many the warm-up reads at start.
    predict_window: int = 20_000
    # Rows one training fits (the newest half of the window whole, older rows sampled): caps its time.
    predict_max_train_rows: int = 20_000
    # How often the job history is read for jobs that ended (on any replica) since the last read.
    predict_sync_interval_s: float = 2.0
    # At most one model call per this many seconds of cycles (a call costs ~10-25 ms whatever its
    # rows); a job that arrives in between is planned without a prediction until the next call.
    predict_batch_interval_s: float = 0.5
    leader_election: bool = True
    leader_key: str = "scheduler"
    leader_ttl_s: float = 5.0
    # Durable consumer names start with this (-jobs, -pool, -health); the pool view reads ephemerally.
    durable_prefix: str = "scheduler"
