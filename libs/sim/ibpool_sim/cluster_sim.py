"""A discrete-event cluster simulator that drives the scheduler's pure core (`ibpool_core.sched`).

Jobs arrive from a trace (traces.py) and wait in the queue; at every instant where something
happened (arrivals, ends, a LAS queue demotion, a failure, a priority refresh) the simulator builds a
`PlanRequest` and applies the `PlanReply` of the same `ibpool_core.sched.plan.plan()` the scheduler
service decides with: the starts come out placed in full (rank order, tier, SHARP trees reserved).

The cluster: `nodes` hosts x `gpus_per_node` GPUs, `hosts_per_leaf` hosts under each leaf switch
(defaults 8 x 8: 80 nodes are 10 leaves), leaves joined by a spine. A job of more GPUs than a host
is a gang over ceil(gpus / gpus_per_node) hosts.

Cost model. The trace's duration is taken as the runtime at the best placement (the minimal leaf
span). A gang's step is compute plus a ring allreduce of S bytes over n hosts, which takes
t = (S / B) * 2(n - 1) / n with B the placement's bottleneck bandwidth per host: `host_link_gbps`
inside one leaf, and `host_link_gbps / spine_oversubscription` once the ring crosses the spine.
With `comm_fraction` the share of the step spent in allreduce at the best placement, a placement
of bandwidth B runs (1 - f) + f * B_best / B times as long (S and n cancel in the ratio).
Defaults: 200 Gb/s per host (one HDR port), 2:1 spine oversubscription, f = 0.3: a gang that fits
one leaf but is spread over two runs 1.3x longer; gangs that cannot fit one leaf pay nothing extra.
With SHARP (in-network reduction) the switches aggregate: each host sends its S bytes up the tree
once and receives the result once, t = S / B, instead of the ring's 2(n - 1)/n * S / B; a gang
placed with SHARP on (`sharp_leaf_share` of the leaves have SHARP-capable switches, and the
framework placement decided it) therefore runs (1 - f) + f * n / (2(n - 1)) * B_best / B times as
long, shorter than the trace (which is taken as measured without in-network reduction).
A preempted job is charged `checkpoint_restore_s` (default 60 s) when it restarts and resumes
where it stopped; a job on a failing host restarts from its last start (no checkpoint), plus the
restore cost.

A real fabric (`fabric`: a generator spec such as `fat_tree_2tier:hosts=64,radix=16` or
`rail_optimised:hosts=80,su_size=8`, or a topology file in any format `ibpool topo convert` reads):
the hosts are the fabric's, the leaves its leaf groups, placement the framework on its `FabricIndex`
(tiers, rails, SHARP-capable switches), and SHARP trees are bounded (`sharp_limits`,
`ibpool_core.sched.sharp.SharpTrees`, held by a job until it ends). The cost model then reads the
fabric: a gang's ring runs at the bottleneck bandwidth between consecutive ranks
(`FabricIndex.bottleneck_gbps`, rank order as placed), against the bandwidth of one host's adapters
at its best placement; with SHARP the ring's 2(n - 1)/n becomes 1. Each multi-node start also
records the tier it landed at and the lowest tier any group of the fabric could hold it at.

Placement: `placement="leaf"` is the core's `LeafPlacer` (best fit, gangs on the fewest leaves);
`"framework"` is the plugin framework with the scheduler service's own profile
(`ibpool_core.sched.profiles.SCHEDULER_PROFILE`: fits, health, GPU model, data locality filters;
topology, load, data locality, link health and bin-packing scores) through the same
`FrameworkPlacer` the service runs, on a fabric of one switch per leaf under one spine. The trace
has no telemetry, datasets or link faults, so those plugins see an idle, healthy cluster.

Speed: the queue is kept sorted per policy order (bisect inserts), so a cycle costs O(scan depth)
plus the running set, not O(queue); the free-capacity view is one list updated in place; cycles run
only when a job could start (free GPUs, or a preemptive policy with something waiting).

The loop is `SimLoop`, in steps: `simulate()` pushes every arrival and runs it to the end; the cells
simulation (cells_sim.py) steps one per cell with a router between them, through its hooks.
"""

from __future__ import annotations

import bisect
import datetime as dt
import heapq
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from ibpool_core.fabric.formats import guess_format, import_topology
from ibpool_core.fabric.generators import GENERATORS, generate
from ibpool_core.fabric.index import FabricIndex
from ibpool_core.fabric.model import Topology
from ibpool_core.sched import framework as fw
from ibpool_core.sched.cycle import CycleConfig
from ibpool_core.sched.fairshare import FairShareState, accrue, fairshare_factors
from ibpool_core.sched.framework_placer import FrameworkPlacer, leaf_fabric
from ibpool_core.sched.jobs import FreeCapacity, Job, QueueStats, RunningJob
from ibpool_core.sched.plan import PlannedStart, PlanRequest, QueueRequest, plan
from ibpool_core.sched.profiles import SCHEDULER_PROFILE
from ibpool_core.sched.queueing import LeastAttainedService, QueuePolicy, SortKey, make_policy
from ibpool_core.sched.runtime import JobFeatures, RecentMedianEstimator, RuntimeEstimator, RuntimeHistory
from ibpool_core.sched.sharp import SharpLimits, SharpTree

from .traces import TraceJob

_FINISH, _FAIL, _RECOVER, _ARRIVE, _DEMOTE, _REFRESH, _WAKE = range(7)  # event kinds, in handling order


class CostModel(msgspec.Struct, frozen=True, kw_only=True):
    host_link_gbps: float = 200.0
    spine_oversubscription: float = 2.0
    comm_fraction: float = 0.3
    checkpoint_restore_s: float = 60.0

    def bottleneck_gbps(self, leaves: int) -> float:
        return self.host_link_gbps if leaves <= 1 else self.host_link_gbps / self.spine_oversubscription

    def allreduce_s(self, size_bytes: float, hosts: int, leaves: int, sharp: bool = False) -> float:
        """Ring allreduce time t = (S / B) * 2(n - 1) / n, B in bytes/s; with SHARP t = S / B."""
        bandwidth = self.bottleneck_gbps(leaves) * 1e9 / 8
        if sharp:
            return size_bytes / bandwidth
        return size_bytes / bandwidth * 2 * (hosts - 1) / hosts

    def stretch(self, hosts: int, leaves: int, min_leaves: int, sharp: bool = False) -> float:
        """How much longer a gang runs on `leaves` leaves (with or without SHARP) than on its minimal
        span without SHARP, the trace's own runtime; below 1 when SHARP saves more than the span costs."""
        if hosts <= 1 or (leaves <= min_leaves and not sharp):
            return 1.0
        ratio = self.allreduce_s(1.0, hosts, leaves, sharp) / self.allreduce_s(1.0, hosts, min_leaves)
        return (1.0 - self.comm_fraction) + self.comm_fraction * ratio


class HostFailure(msgspec.Struct, frozen=True, kw_only=True):
    """Host `host` goes down at `at_s` for `down_s` seconds; its jobs are requeued."""

    host: int
    at_s: float
    down_s: float


class SimConfig(msgspec.Struct, frozen=True, kw_only=True):
    nodes: int = 80
    gpus_per_node: int = 8
    hosts_per_leaf: int = 8
    policy: str = "fifo"
    policy_params: dict[str, Any] = {}
    cycle: CycleConfig = CycleConfig()
    cost: CostModel = CostModel()
    failures: list[HostFailure] = []
    fairshare_half_life_s: float = 7 * 86_400.0
    label: str | None = None
    # "leaf": the core's LeafPlacer; "framework": the service's plugin profile (module docstring).
    placement: str = "leaf"
    # Share of the leaves (the first ones) whose switches can aggregate (SHARP); framework only.
    sharp_leaf_share: float = 0.0
    # Hosts a single-host job is scored on (the service's `placement_sample`); 0: all.
    placement_sample: int = 16
    # A real fabric (module docstring): a generator spec or a topology file; None: `hosts_per_leaf`
    # hosts per leaf under one spine. With a fabric, placement is the framework and `nodes` its hosts.
    fabric: str | None = None
    sharp_limits: SharpLimits = SharpLimits()
    # Runtimes known exactly at submit (the EASY reference baseline): the cycle plans with the trace's duration.
    exact_runtimes: bool = False


class JobOutcome(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    gpus: int
    hosts: int
    submit_s: float
    first_start_s: float
    end_s: float
    duration_s: float
    preemptions: int
    leaves: int
    min_leaves: int
    killed: bool = False
    sharp: bool = False
    # With a fabric: the tier of the smallest switch group holding the gang, and the lowest tier any
    # group of the fabric holds a gang of its size at (0 for a single host).
    tier: int = 0
    min_tier: int = 0


class SimResult(msgspec.Struct, frozen=True, kw_only=True):
    label: str
    outcomes: list[JobOutcome]
    busy_gpu_s: float
    total_gpus: int
    cycles: int
    wall_s: float
    cpu_s: float
    multi_node_starts: int
    minimal_span_starts: int
    sharp_starts: int = 0
    # With a fabric: multi-node starts at the lowest tier the fabric could give them.
    minimal_tier_starts: int = 0

    @property
    def makespan_s(self) -> float:
        if not self.outcomes:
            return 0.0
        return max(o.end_s for o in self.outcomes) - min(o.submit_s for o in self.outcomes)

    def summary(self) -> dict[str, float | int | str]:
        """The table row: JCT statistics, queueing delay, utilisation, makespan, leaf-span share."""
        jct = sorted(o.end_s - o.submit_s for o in self.outcomes)
        waits = [o.first_start_s - o.submit_s for o in self.outcomes]
        makespan = self.makespan_s
        n = len(jct)
        return {
            "policy": self.label,
            "jobs": n,
            "avg_jct_s": statistics.fmean(jct) if jct else 0.0,
            "median_jct_s": statistics.median(jct) if jct else 0.0,
            "p99_jct_s": jct[min(n - 1, math.ceil(0.99 * n) - 1)] if jct else 0.0,
            "avg_queue_s": statistics.fmean(waits) if waits else 0.0,
            "utilisation": self.busy_gpu_s / (self.total_gpus * makespan) if makespan > 0 else 0.0,
            "makespan_s": makespan,
            "preemptions": sum(o.preemptions for o in self.outcomes),
            "min_span_share": self.minimal_span_starts / self.multi_node_starts if self.multi_node_starts else 1.0,
            "sharp_share": self.sharp_starts / self.multi_node_starts if self.multi_node_starts else 0.0,
            "min_tier_share": self.minimal_tier_starts / self.multi_node_starts if self.multi_node_starts else 1.0,
            "cycles": self.cycles,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
        }


class _Active(msgspec.Struct, kw_only=True):
    run: RunningJob
    generation: int
    stretch: float
    restore_s: float
    leaves: int
    min_leaves: int


class _Progress(msgspec.Struct, kw_only=True):
    trace: TraceJob
    remaining_s: float
    generation: int = 0
    first_start_s: float | None = None
    preemptions: int = 0
    restarts: int = 0
    leaves: int = 0
    min_leaves: int = 1
    sharp: bool = False
    tier: int = 0
    min_tier: int = 0


class _SortedQueues:
    """The waiting jobs, kept sorted once per policy order (bisect inserts and deletes)."""

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self.keys: dict[str, list[SortKey]] = {o: [] for o in policy.orders}
        self.jobs: dict[str, list[Job]] = {o: [] for o in policy.orders}
        self.key_of: dict[str, dict[str, SortKey]] = {o: {} for o in policy.orders}
        self.fairshare: dict[str, float] = {}

    def add(self, job: Job) -> None:
        for order in self.policy.orders:
            key = self.policy.order_key(order, job, self.fairshare)
            keys = self.keys[order]
            i = bisect.bisect_left(keys, key)
            keys.insert(i, key)
            self.jobs[order].insert(i, job)
            self.key_of[order][job.id] = key

    def remove(self, job_id: str) -> Job:
        job: Job | None = None
        for order in self.policy.orders:
            key = self.key_of[order].pop(job_id)
            keys = self.keys[order]
            i = bisect.bisect_left(keys, key)
            del keys[i]
            job = self.jobs[order].pop(i)
        assert job is not None and job.id == job_id
        return job

    def rekey(self, fairshare: dict[str, float]) -> None:
        self.fairshare = fairshare
        for order in self.policy.orders:
            pairs = sorted((self.policy.order_key(order, j, fairshare), j) for j in self.jobs[order])
            self.keys[order] = [k for k, _ in pairs]
            self.jobs[order] = [j for _, j in pairs]
            self.key_of[order] = {j.id: k for k, j in pairs}


def gang_nodes(gpus: int, gpus_per_node: int) -> int:
    return max(1, -(-gpus // gpus_per_node))


def simulate(
    trace: Sequence[TraceJob],
    config: SimConfig,
    *,
    estimator: RuntimeEstimator | None = None,
    policy: QueuePolicy | None = None,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """Replay `trace` (in submit order) on the configured cluster under one policy; deterministic.

    `estimator` predicts runtimes at submit and learns at each end (default: a fresh
    `RecentMedianEstimator`); `policy` overrides `config.policy`. `progress` is called with the
    fraction of jobs finished, at most every 1% of them.
    """
    started_wall = time.perf_counter()
    started_cpu = time.process_time()
    policy = policy if policy is not None else make_sim_policy(config, trace)
    real = SimFabric(load_fabric(config.fabric), config) if config.fabric is not None else None
    loop = SimLoop(
        config,
        policy,
        fabric=real,
        estimator=estimator,
        tenants=sorted({t.tenant for t in trace}),  # fair share is refreshed for every tenant of the trace
        first_submit=trace[0].submit_s if trace else None,
        jobs=len(trace),
        progress=progress,
    )
    too_big = [t.id for t in trace if gang_nodes(t.gpus, loop.config.gpus_per_node) > loop.config.nodes]
    if too_big:
        raise ValueError(f"{len(too_big)} jobs need more hosts than the cluster has, e.g. {too_big[0]}")
    for t in trace:
        loop.arrive(t, t.submit_s)
    loop.run()
    if progress is not None:
        progress(1.0)
    return loop.result(
        config.label or config.policy, time.perf_counter() - started_wall, time.process_time() - started_cpu
    )


class SimLoop:
    """The simulator's event loop on one cluster, in steps: `simulate()` runs one over a whole trace,
    `cells_sim` one per cell, with a router between them. Deterministic.

    Jobs come in by `arrive(trace job, at)` (an arrival event, handled with the others of its
    instant). A step at `now = next_at()`: `handle(now)` pops and handles that instant's events
    (`before_arrivals=True`: only those that come before its arrivals: ends, failures, recoveries),
    then `cycle(now)` plans and carries out a cycle if an event asked for one. `run()` steps until no
    event is left; `result()` is the run's `SimResult`. Host failures are `config.failures`; with
    `progress`, it is called with the fraction of the `jobs` expected that finished, at most every 1%.

    A subclass changes what happens around a job through the hooks: `on_start` (a job has its
    hosts; by default it runs: `run_until_end`), `on_requeue` (a running job went back to the
    queue), `on_end` (a job ended at its end event), `learns_from` (whether an ended job trains the
    runtime estimator and a learning policy) and `more_to_come` (whether jobs may still arrive that
    were not pushed yet: the fair-share refresh goes on while they may). `wake(now)` asks for a cycle
    at `now`.
    """

    def __init__(
        self,
        config: SimConfig,
        policy: QueuePolicy,
        *,
        fabric: SimFabric | None = None,
        estimator: RuntimeEstimator | None = None,
        tenants: Sequence[str] = (),
        first_submit: float | None = None,
        jobs: int = 0,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        """`fabric` the cluster's real fabric (then its hosts and leaf groups replace `config`'s, and
        placement is the framework); `tenants` those the fair share is refreshed for; `first_submit`
        the first submission (the first fair-share refresh is `policy.refresh_s` after it)."""
        if fabric is not None:
            config = msgspec.structs.replace(
                config, nodes=len(fabric.names), hosts_per_leaf=fabric.hosts_per_leaf, placement="framework"
            )
        self.config = config
        self.real = fabric
        self.policy = policy
        self.estimator: RuntimeEstimator = estimator if estimator is not None else RecentMedianEstimator()
        self.cost = config.cost
        self.cycle_cfg = msgspec.structs.replace(config.cycle, hosts_per_leaf=config.hosts_per_leaf, explain=False)
        self.free = [config.gpus_per_node] * config.nodes
        self.cluster = FreeCapacity(
            free=self.free,
            capacity=[config.gpus_per_node] * config.nodes,
            leaf_of=(
                fabric.leaf_of if fabric is not None else [h // config.hosts_per_leaf for h in range(config.nodes)]
            ),
        )
        self.placer: FrameworkPlacer | None = None
        if fabric is not None:
            self.placer = fabric.placer
        elif config.placement == "framework":
            self.placer = framework_placer(config)
        self.names = fabric.names if fabric is not None else [host_name(h) for h in range(config.nodes)]
        self.held_trees: dict[str, SharpTree] = {}  # job id -> the SHARP trees it holds until it ends
        self.total_gpus = config.gpus_per_node * config.nodes
        self.events: list[tuple[float, int, int, str, int]] = []  # (at, kind, sequence, job id, generation)
        self.seq = 0
        self.refresh_s = policy.refresh_s
        self.tenants = list(tenants)
        for i, failure in enumerate(config.failures):
            self.push(failure.at_s, _FAIL, str(i))
        if self.refresh_s is not None and first_submit is not None:
            self.push(first_submit + self.refresh_s, _REFRESH)
        self.by_id: dict[str, TraceJob] = {}
        self.hosts_of: dict[str, int] = {}  # jobs that arrived with their host count given
        self.arrived = 0
        self.progress_of: dict[str, _Progress] = {}
        self.queues = _SortedQueues(policy)
        self.active: dict[str, _Active] = {}
        self.running_keys: list[tuple[float, str]] = []  # (planned end, id), sorted; running_list in the same order
        self.running_list: list[RunningJob] = []
        self.on_host: list[set[str]] = [set() for _ in range(config.nodes)]
        self.down: set[int] = set()
        self.outcomes: list[JobOutcome] = []
        self.busy_gpu_s = 0.0
        self.cycles = self.multi_node_starts = self.minimal_span_starts = self.sharp_starts = 0
        self.minimal_tier_starts = 0
        self.waiting_gpus = 0
        self.oldest: list[tuple[float, str]] = []  # (submit, id) of waiting jobs; lazily cleaned
        self.recent_waits: deque[float] = deque(maxlen=256)
        self.wait_p90 = 0.0
        self.starts_since_p90 = 0
        self.fairshare = FairShareState()
        self.las = policy if isinstance(policy, LeastAttainedService) else None
        self.learned = getattr(policy, "history", None)  # a policy that learns runtimes from ended jobs
        self.dynamic = len(policy.orders) > 1
        self.first_order = policy.orders[0]
        self.progress = progress
        self.jobs = jobs
        self.report_every = max(1, jobs // 100)
        self.wanted = False  # an event of this instant asked for a cycle

    # -- hooks -----------------------------------------------------------------------------------

    def on_start(self, job_id: str, now: float, restore_s: float, runtime_s: float) -> None:
        """A job was given its hosts at `now`: it runs `runtime_s` after a restore of `restore_s`."""
        self.run_until_end(job_id, now, restore_s, runtime_s)

    def on_requeue(self, job_id: str, now: float) -> None:
        """A running job went back to the queue (preempted, or its host failed)."""

    def on_end(self, job_id: str, now: float) -> None:
        """A job ended at its end event (not killed)."""

    def learns_from(self, job_id: str) -> bool:
        """Whether the job's runtime, when it ends, trains the estimator and a learning policy."""
        return True

    def more_to_come(self) -> bool:
        """Whether jobs not yet arrived may still be (the fair-share refresh goes on while they may)."""
        return False

    # -- the loop's parts ------------------------------------------------------------------------

    def push(self, at: float, kind: int, key: str = "", generation: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, kind, self.seq, key, generation))

    def features(self, t: TraceJob) -> JobFeatures:
        return JobFeatures(
            tenant=t.tenant, num_gpus=t.gpus, submit_time=t.submit_s, requested_limit_s=t.time_limit_s, name=t.name
        )

    def job_of(self, t: TraceJob, hosts: int | None = None) -> Job:
        """The queue's job for a trace job (its runtime predicted now), on `hosts` hosts (default:
        as many as its GPUs fill)."""
        return Job(
            id=t.id,
            tenant=t.tenant,
            gpus=t.gpus,
            hosts=hosts if hosts is not None else gang_nodes(t.gpus, self.config.gpus_per_node),
            priority=t.priority,
            submit_time=t.submit_s,
            time_limit_s=t.time_limit_s,
            predicted=self.estimator.predict(self.features(t)),
            true_runtime_s=t.duration_s,
            requested_runtime_s=t.duration_s if self.config.exact_runtimes else None,
        )

    def enqueue(self, job: Job) -> None:
        self.queues.add(job)
        self.waiting_gpus += job.gpus
        heapq.heappush(self.oldest, (job.submit_time, job.id))

    def release(self, job_id: str, now: float) -> _Active:
        act = self.active.pop(job_id)
        i = bisect.bisect_left(self.running_keys, (act.run.planned_end, job_id))
        del self.running_keys[i]
        del self.running_list[i]
        for host, gpus in act.run.hosts:
            self.on_host[host].discard(job_id)
            if host not in self.down:
                self.free[host] += gpus
        self.busy_gpu_s += act.run.job.gpus * (now - act.run.started_at)
        self.held_trees.pop(job_id, None)
        return act

    def requeue(self, job_id: str, now: float, *, checkpointed: bool) -> None:
        """Stop a running job and queue it again: resumed where it stopped if `checkpointed`, else
        from its last start."""
        act = self.release(job_id, now)
        prog = self.progress_of[job_id]
        ran = now - act.run.started_at
        if checkpointed:
            prog.remaining_s = max(0.0, prog.remaining_s - max(0.0, ran - act.restore_s) / act.stretch)
        prog.generation += 1
        prog.restarts += 1
        job = msgspec.structs.replace(
            act.run.job,
            attained_gpu_s=act.run.job.attained_gpu_s + act.run.job.gpus * ran,
            true_runtime_s=prog.remaining_s,
        )
        self.enqueue(job)
        self.on_requeue(job_id, now)

    def finish(self, job_id: str, now: float, *, killed: bool = False) -> None:
        act = self.release(job_id, now)
        prog = self.progress_of.pop(job_id)
        t = prog.trace
        assert prog.first_start_s is not None
        self.outcomes.append(
            JobOutcome(
                id=t.id,
                gpus=t.gpus,
                hosts=act.run.job.hosts,
                submit_s=t.submit_s,
                first_start_s=prog.first_start_s,
                end_s=now,
                duration_s=t.duration_s,
                preemptions=prog.preemptions,
                leaves=prog.leaves,
                min_leaves=prog.min_leaves,
                killed=killed,
                sharp=prog.sharp,
                tier=prog.tier,
                min_tier=prog.min_tier,
            )
        )
        if not killed and self.learns_from(job_id):
            self.estimator.observe(self.features(t), t.duration_s)
            if isinstance(self.learned, RuntimeHistory):
                self.learned.observe(self.features(t), t.duration_s)
        if self.progress is not None and len(self.outcomes) % self.report_every == 0:
            self.progress(len(self.outcomes) / max(self.jobs, len(self.outcomes)))

    def start(self, planned: PlannedStart, now: float) -> None:
        job_id, hosts, planned_end = planned.job_id, planned.hosts, planned.planned_end
        leaves, min_leaves = planned.leaves, planned.min_leaves
        job = self.queues.remove(job_id)
        if self.placer is not None:
            self.placer.results.pop(job_id, None)
        placement = planned.placement
        sharp = placement.sharp and job.hosts > 1
        tier = min_tier = 0
        stretch: float | None = None
        real = self.real
        if placement.sharp_tree is not None:
            self.held_trees[job_id] = placement.sharp_tree
        if real is not None and job.hosts > 1:
            ranked = placement.ranks
            tier = placement.tier if placement.tier is not None else real.index.levels + 1
            min_tier = real.view.lowest_level_holding(job.hosts)
            self.minimal_tier_starts += tier <= min_tier
            stretch = real.stretch(ranked, sharp, self.cost.comm_fraction)
        self.waiting_gpus -= job.gpus
        prog = self.progress_of[job_id]
        if prog.first_start_s is None:
            prog.first_start_s = now
            self.recent_waits.append(now - job.submit_time)
            self.starts_since_p90 += 1
        prog.leaves, prog.min_leaves, prog.sharp, prog.tier, prog.min_tier = leaves, min_leaves, sharp, tier, min_tier
        if job.hosts > 1:
            self.multi_node_starts += 1
            self.minimal_span_starts += leaves <= min_leaves
            self.sharp_starts += sharp
        if stretch is None:
            stretch = self.cost.stretch(job.hosts, leaves, min_leaves, sharp)
        restore = self.cost.checkpoint_restore_s if prog.restarts else 0.0
        run = RunningJob(job=job, hosts=tuple(hosts), started_at=now, planned_end=planned_end)
        i = bisect.bisect_left(self.running_keys, (planned_end, job_id))
        self.running_keys.insert(i, (planned_end, job_id))
        self.running_list.insert(i, run)
        self.active[job_id] = _Active(
            run=run,
            generation=prog.generation,
            stretch=stretch,
            restore_s=restore,
            leaves=leaves,
            min_leaves=min_leaves,
        )
        for host, gpus in hosts:
            self.free[host] -= gpus
            self.on_host[host].add(job_id)
        self.on_start(job_id, now, restore, prog.remaining_s * stretch)

    def run_until_end(self, job_id: str, now: float, restore_s: float, runtime_s: float) -> None:
        """Push the running job's end, `restore_s + runtime_s` from `now`, and its first LAS demotion."""
        prog = self.progress_of[job_id]
        job = self.active[job_id].run.job
        self.push(now + restore_s + runtime_s, _FINISH, job_id, prog.generation)
        for threshold in self.las.thresholds_gpu_s(job.gpus) if self.las is not None else ():
            if threshold > job.attained_gpu_s:
                self.push(
                    now + restore_s + (threshold - job.attained_gpu_s) / job.gpus, _DEMOTE, job_id, prog.generation
                )
                break

    def stats(self, now: float) -> QueueStats:
        first = self.queues.key_of[self.first_order]
        while self.oldest and self.oldest[0][1] not in first:
            heapq.heappop(self.oldest)
        if self.starts_since_p90 >= 16 and self.recent_waits:
            ordered = sorted(self.recent_waits)
            self.wait_p90 = ordered[int(0.9 * (len(ordered) - 1))]
            self.starts_since_p90 = 0
        return QueueStats(
            queue_len=len(first),
            waiting_gpus=self.waiting_gpus,
            utilisation=1.0 - sum(self.free) / self.total_gpus,
            oldest_wait_s=now - self.oldest[0][0] if self.oldest else 0.0,
            recent_wait_p90_s=self.wait_p90,
        )

    # -- steps -----------------------------------------------------------------------------------

    def arrive(self, t: TraceJob, at: float, hosts: int | None = None) -> None:
        """Job `t` arrives at `at` (an event, handled with that instant's others), on `hosts` hosts
        if given (default: as many as its GPUs fill)."""
        self.by_id[t.id] = t
        if hosts is not None:
            self.hosts_of[t.id] = hosts
        self.arrived += 1
        self.push(at, _ARRIVE, t.id)

    def wake(self, now: float) -> None:
        """Ask for a cycle at `now` (an event, handled with that instant's others)."""
        self.push(now, _WAKE)

    def next_at(self) -> float:
        """When the next event is; infinity when none is left."""
        return self.events[0][0] if self.events else math.inf

    def handle(self, now: float, *, before_arrivals: bool = False) -> None:
        """Pop and handle the events at `now` (with `before_arrivals`, only the kinds that come
        before arrivals: ends, failures, recoveries), including those they push at `now`."""
        events = self.events
        below = _ARRIVE if before_arrivals else _WAKE + 1
        while events and events[0][0] == now and events[0][1] < below:
            _, kind, _, key, generation = heapq.heappop(events)
            if kind == _ARRIVE:
                t = self.by_id[key]
                self.progress_of[key] = _Progress(trace=t, remaining_s=t.duration_s)
                self.enqueue(self.job_of(t, self.hosts_of.get(key)))
                self.wanted = True
            elif kind == _FINISH:
                if key in self.active and self.active[key].generation == generation:
                    self.finish(key, now)
                    self.on_end(key, now)
                    self.wanted = True
            elif kind == _DEMOTE:
                if key in self.active and self.active[key].generation == generation:
                    act = self.active[key]
                    attained = act.run.job.attained_gpu_s + act.run.job.gpus * (now - act.run.started_at)
                    assert self.las is not None
                    for threshold in self.las.thresholds_gpu_s(act.run.job.gpus):
                        if threshold > attained + 1e-6:
                            self.push(now + (threshold - attained) / act.run.job.gpus, _DEMOTE, key, generation)
                            break
                    self.wanted = True
            elif kind == _FAIL:
                failure = self.config.failures[int(key)]
                for job_id in sorted(self.on_host[failure.host]):
                    self.progress_of[job_id].preemptions += 1
                    self.requeue(job_id, now, checkpointed=False)
                self.down.add(failure.host)
                self.free[failure.host] = 0
                self.push(now + failure.down_s, _RECOVER, key)
                self.wanted = True
            elif kind == _RECOVER:
                host = self.config.failures[int(key)].host
                self.down.discard(host)
                self.free[host] = self.config.gpus_per_node - sum(
                    g for j in self.on_host[host] for h, g in self.active[j].run.hosts if h == host
                )
                self.wanted = True
            elif kind == _REFRESH:
                by_tenant: dict[str, int] = {}
                for act in self.active.values():
                    by_tenant[act.run.job.tenant] = by_tenant.get(act.run.job.tenant, 0) + act.run.job.gpus
                self.fairshare = accrue(self.fairshare, now, by_tenant, self.config.fairshare_half_life_s)
                self.queues.rekey(fairshare_factors(self.fairshare, self.tenants))
                waiting = self.queues.key_of[self.first_order] or self.active
                if self.refresh_s is not None and (waiting or self.more_to_come() or len(self.outcomes) < self.arrived):
                    self.push(now + self.refresh_s, _REFRESH)
                self.wanted = True
            elif kind == _WAKE:
                self.wanted = True

    def cycle(self, now: float) -> None:
        """Plan a cycle at `now` and carry it out (kills, preemptions, starts), if an event handled
        since the last cycle asked for one and one could start a job."""
        wanted, self.wanted = self.wanted, False
        queues, policy = self.queues, self.policy
        if not wanted or not queues.key_of[self.first_order]:
            return
        if not policy.preemptive and sum(self.free) == 0:
            return
        queue_stats = self.stats(now) if self.dynamic else QueueStats()
        order = policy.choose_order(queue_stats)
        reply = plan(
            PlanRequest(
                now=now,
                queues=[
                    QueueRequest(
                        jobs=queues.jobs[order], policy=policy, config=self.cycle_cfg, stats=queue_stats, order=order
                    )
                ],
                running=self.running_list,
                running_sorted_by_end=True,
                cluster=self.cluster,
                names=self.names,
                fairshare=queues.fairshare,
                placer=self.placer,
                sharp_limits=self.config.sharp_limits if self.real is not None else None,
                sharp_held=self.held_trees,
            )
        )
        self.cycles += 1
        for job_id in reply.kills:
            self.finish(job_id, now, killed=True)
        for p in reply.preemptions:
            self.progress_of[p.job_id].preemptions += 1
            self.requeue(p.job_id, now, checkpointed=True)
        for s in reply.starts:
            self.start(s, now)

    def run(self) -> None:
        """Step until no event is left."""
        while self.events:
            now = self.events[0][0]
            self.handle(now)
            self.cycle(now)

    def result(self, label: str, wall_s: float, cpu_s: float) -> SimResult:
        return SimResult(
            label=label,
            outcomes=sorted(self.outcomes, key=lambda o: o.id),
            busy_gpu_s=self.busy_gpu_s,
            total_gpus=self.total_gpus,
            cycles=self.cycles,
            wall_s=wall_s,
            cpu_s=cpu_s,
            multi_node_starts=self.multi_node_starts,
            minimal_span_starts=self.minimal_span_starts,
            sharp_starts=self.sharp_starts,
            minimal_tier_starts=self.minimal_tier_starts,
        )


def load_fabric(spec: str) -> Topology:
    """A generator spec (`kind:key=value,...`, kinds of `ibpool_core.fabric.generators`) or the path
    of a topology file in any import format (guessed); ValueError naming what is wrong."""
    if spec.partition(":")[0] in GENERATORS:
        return generate(spec)
    try:
        text = open(spec, encoding="utf-8").read()
    except OSError as e:
        raise ValueError(
            f"fabric {spec!r}: not a generator spec ({', '.join(GENERATORS)}) nor a readable file: {e}"
        ) from None
    return import_topology(guess_format(spec, text), text, file=spec, name=spec)


class SimFabric:
    """The simulated cluster on a real fabric: its hosts (sorted names, index = host index), leaf
    groups, the framework placer on its index and the cost of a ring."""

    def __init__(self, topology: Topology, config: SimConfig) -> None:
        index = FabricIndex(topology)
        self.index = index
        self.names = [h for h in index.hosts if index.rails(h)]
        if not self.names:
            raise ValueError("the fabric has no host cabled to a switch")
        hosts = [
            fw.HostState(name=n, gpu_model="", total_gpus=config.gpus_per_node, free_gpus=config.gpus_per_node)
            for n in self.names
        ]
        self.view = fw.ClusterView(index, hosts)
        self.leaf_of = [self.view.group_of[n] for n in self.names]
        self.hosts_per_leaf = max(len(g) for g in self.view.group_hosts)
        self.placer = FrameworkPlacer(
            fw.Framework(fw.build_profile(SCHEDULER_PROFILE)),
            self.view,
            self.names,
            {},
            dt.datetime(2017, 1, 1, tzinfo=dt.UTC),
            sample=config.placement_sample,
        )
        # The bandwidth a ring inside one leaf group runs at (the best placement's).
        group = max(self.view.group_hosts, key=len)
        self.best_gbps = (index.bottleneck_gbps(group[0], group[1]) if len(group) > 1 else None) or 1.0
        # (level, index) of a subtree -> its bisection bandwidth per host (Gb/s)
        self.bisection_per_host: dict[tuple[int, int], float] = {}

    def stretch(self, ranked: list[str], sharp: bool, comm_fraction: float) -> float:
        """How much longer than the trace's runtime (its best placement without SHARP) the gang runs:
        its ring at the slowest link between consecutive ranks, and at most the per-host share of
        its covering subtree's bisection (an oversubscribed tier halves it at 2:1); with SHARP,
        S / B instead of the ring's 2(n - 1)/n * S / B."""
        n = len(ranked)
        slowest = min(
            (self.index.bottleneck_gbps(a, b) or 0.0 for a, b in zip(ranked, ranked[1:] + ranked[:1], strict=True)),
            default=self.best_gbps,
        )
        covering = self.index.covering_subtree(ranked)
        if covering is not None and len(covering.hosts) > 1:
            cut = self.bisection_per_host.get((covering.level, covering.index))
            if cut is None:
                whole = self.index.bisection_gbps(covering)
                cut = whole / (len(covering.hosts) / 2) if whole else math.inf
                self.bisection_per_host[(covering.level, covering.index)] = cut
            slowest = min(slowest, cut)
        ratio = self.best_gbps / max(slowest, 1e-9)
        if sharp:
            ratio *= n / (2 * (n - 1))
        return (1.0 - comm_fraction) + comm_fraction * ratio


def host_name(h: int) -> str:
    return f"h{h:05d}"


def framework_placer(config: SimConfig) -> FrameworkPlacer:
    """The service's placement (`SCHEDULER_PROFILE`) on the simulated cluster: one leaf switch per
    `hosts_per_leaf` hosts (the first `sharp_leaf_share` of them SHARP-capable) under one spine."""
    if not 0.0 <= config.sharp_leaf_share <= 1.0:
        raise ValueError(f"sharp_leaf_share must be within 0..1, got {config.sharp_leaf_share}")
    names = [host_name(h) for h in range(config.nodes)]
    leaves = -(-config.nodes // config.hosts_per_leaf)
    sharp = {f"leaf{i:04d}" for i in range(math.ceil(config.sharp_leaf_share * leaves - 1e-9))}
    fabric = leaf_fabric({n: f"leaf{h // config.hosts_per_leaf:04d}" for h, n in enumerate(names)}, sharp)
    hosts = [
        fw.HostState(name=n, gpu_model="", total_gpus=config.gpus_per_node, free_gpus=config.gpus_per_node)
        for n in names
    ]
    return FrameworkPlacer(
        fw.Framework(fw.build_profile(SCHEDULER_PROFILE)),
        fw.ClusterView(fabric, hosts),
        names,
        {},
        dt.datetime(2017, 1, 1, tzinfo=dt.UTC),
        sample=config.placement_sample,
    )


def gittins_samples(trace: Sequence[TraceJob], share: float = 0.1) -> list[float]:
    """GPU-times of the first `share` of the trace: the history a Gittins policy learns its distribution from."""
    head = trace[: max(1, int(len(trace) * share))]
    return sorted(t.gpus * t.duration_s for t in head)


def make_sim_policy(config: SimConfig, trace: Sequence[TraceJob]) -> QueuePolicy:
    """The configured policy; `gittins` and `dynamic` without samples get the trace's first 10% as history."""
    if config.policy in ("gittins", "dynamic") and "samples" not in config.policy_params:
        return make_policy(config.policy, samples=gittins_samples(trace), **config.policy_params)
    return make_policy(config.policy, **config.policy_params)
