"""One cycle's plan: the pool as the ledger replica shows it + the live jobs -> `schedule()` -> exact GPUs. Pure.

The core decides on dense host indices and GPU counts; this module builds its `ClusterView` from
the ledger (ready nodes, whole free GPUs of ready GPUs) and maps its starts back to node ids and
GPU indices, the exact assignment a `ProposePlacement` carries. GPUs are counted as taken when the
ledger holds a grant on them, and also while the ledger replica has not seen yet what the
scheduler already knows: a proposal in flight, or a grant the replica has not folded in.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping, Sequence

import msgspec

from ibpool_core.fabric.index import FabricIndex
from ibpool_core.fabric.link_health import LinkState
from ibpool_core.pool.ledger import Ledger, Node
from ibpool_core.sched import framework as fw
from ibpool_core.sched.backfill import reserve
from ibpool_core.sched.cycle import CycleConfig, Preemption, SchedulingReply, SchedulingRequest, Start, schedule
from ibpool_core.sched.framework_placer import AskHints, FrameworkPlacer, leaf_fabric
from ibpool_core.sched.jobs import ClusterView, Job, RunningJob, estimated_runtime, host_shares
from ibpool_core.sched.placer import FreeView, LeafPlacer, Placer, min_leaf_span
from ibpool_core.sched.queueing import QueuePolicy
from ibpool_proto.pool import GpuAssignment

from .jobs import JobRecord

UNLABELLED_LEAF = ""
# The core's reason when a cycle meets a job with no GPU free at all; it computes no reservation then.
NO_FREE_GPUS = "no free GPUs"
# The end of the core's reason for a job that no release of running jobs would let start.
NEVER_FITS = "never fits the current hosts"


class Proposal(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    assignments: list[GpuAssignment]


class CyclePlan(msgspec.Struct, frozen=True, kw_only=True):
    """What to do after one cycle, by job id, on the ledger version the view was built from."""

    ledger_version: int
    proposals: list[Proposal] = []
    preempted: list[tuple[str, str]] = []  # (victim, for whom)
    killed: list[str] = []
    waiting: dict[str, str] = {}
    order: str = ""

    def preempted_ids(self) -> list[str]:
        return [victim for victim, _ in self.preempted]


class HostView(msgspec.Struct, frozen=True, kw_only=True):
    """The cycle's hosts: index -> node id, the free GPU indices of each, and the core's view."""

    node_ids: list[str]
    free_gpus: list[Sequence[int]]  # not to be changed: unchanged nodes share them with the next cycle
    cluster: ClusterView
    hosts_per_leaf: int


def taken_in_flight(ledger: Ledger, jobs: Iterable[JobRecord]) -> dict[str, set[int]]:
    """GPUs the scheduler holds that the ledger replica does not show yet, per node."""
    taken: dict[str, set[int]] = {}

    def take(assignments: Sequence[GpuAssignment]) -> None:
        for a in assignments:
            taken.setdefault(a.node_id, set()).add(a.gpu_index)

    for job in jobs:
        if job.state == "proposed" and job.proposal_id not in ledger.allocations:
            take(job.proposal)
        elif job.holding and job.allocation_id not in ledger.allocations:
            take(job.assignments)
    return taken


class NodeOffer(msgspec.Struct, frozen=True):
    """What one node offers a cycle, before the GPUs in flight are taken out."""

    offered: bool  # ready, with GPUs
    free: tuple[int, ...]  # indices of its ready GPUs that hold no grant and no MIG layout
    capacity: int
    leaf: str


# Node id -> (the node as last seen, its offer). Nodes are frozen and the ledger replaces a node on
# every change, so an identical object means the same offer: a cycle recomputes only the nodes that
# changed since the last one (1,000 nodes x 8 GPUs otherwise).
FreeCache = dict[str, tuple[Node, NodeOffer]]


def offer_of(node: Node, leaf_label: str, cache: FreeCache | None) -> NodeOffer:
    if cache is not None and (hit := cache.get(node.node_id)) is not None and hit[0] is node:
        return hit[1]
    offer = NodeOffer(
        # A leaf-cordoned node (a degraded leaf link) is left out for every job here, single-node ones
        # too: the allocator would take those, but the cycle's view has no per-job node filter yet.
        offered=node.ready_for(multi_node=True) and bool(node.gpus),
        free=tuple(g.index for g in node.gpus if g.ready and g.fits_whole() and not g.mig),
        capacity=len(node.gpus),
        leaf=node.labels.get(leaf_label, UNLABELLED_LEAF),
    )
    if cache is not None:
        cache[node.node_id] = (node, offer)
    return offer


class PlanCache:
    """Work one cycle can hand to the next; never changes a plan (the same plan without it).

    `offers`: see `FreeCache`. `running`: job id -> (its record, the core's RunningJob) of jobs that
    hold GPUs since a known time; reused while the record is the same object (`state.live_jobs`
    returns the same record for an unchanged row) and the hosts are the same list (`node_ids`).
    """

    def __init__(self) -> None:
        self.offers: FreeCache = {}
        self.node_ids: list[str] = []
        self.running: dict[str, tuple[JobRecord, RunningJob]] = {}
        # The placement view (framework.ClusterView) and the fabric it sits on, while their inputs hold.
        self.fabric_key: object = None
        self.fabric: FabricIndex | None = None
        self.view_key: object = None
        self.view: fw.ClusterView | None = None


class PlacementInputs:
    """What the framework's plugins read besides the ledger, for one cycle.

    framework   the built profile (None: the core's `LeafPlacer` places)
    telemetry   node id -> its newest telemetry (absent: idle and cool)
    node_links  node id -> worst state of its links (absent: up); `links_version` changes with it
    datasets    dataset -> node ids holding it; `datasets_version` changes with it
    sharp_label node label whose value "true" puts the node under a SHARP-capable leaf
    sample      hosts scored per single-host job (0: all)
    fairshare   tenant -> fair-share factor (`ibpool_core.sched.fairshare`), read by the policies
    """

    def __init__(
        self,
        framework: fw.Framework | None = None,
        *,
        telemetry: Mapping[str, fw.Telemetry] | None = None,
        node_links: Mapping[str, LinkState] | None = None,
        links_version: int = 0,
        datasets: Mapping[str, Collection[str]] | None = None,
        datasets_version: int = 0,
        sharp_label: str = "ibpool.io/sharp",
        sample: int = 0,
        fairshare: Mapping[str, float] | None = None,
    ) -> None:
        self.framework = framework
        self.telemetry = telemetry or {}
        self.node_links = node_links or {}
        self.links_version = links_version
        self.datasets = datasets or {}
        self.datasets_version = datasets_version
        self.sharp_label = sharp_label
        self.sample = sample
        self.fairshare = fairshare or {}


NO_PLACEMENT_INPUTS = PlacementInputs()
IDLE = fw.Telemetry()


def placement_view(ledger: Ledger, view: HostView, inputs: PlacementInputs, cache: PlanCache | None) -> fw.ClusterView:
    """The framework's view of the cycle's hosts: the fabric of their leaves, GPU models, telemetry,
    link states and datasets; reused from `cache` while those inputs hold (telemetry is refreshed in
    place; free GPUs are brought in step by `FrameworkPlacer` before each placement)."""
    nodes = ledger.nodes
    offers = [(n, nodes[n]) for n in view.node_ids]
    leaf_of: dict[str, str] = {}
    sharp_leaves: set[str] = set()
    for h, (n, node) in enumerate(offers):
        leaf_name = str(view.cluster.leaf_of[h])
        leaf_of[n] = leaf_name
        if node.labels.get(inputs.sharp_label, "").lower() == "true":
            sharp_leaves.add(leaf_name)
    fabric_key = (tuple(view.node_ids), tuple(view.cluster.leaf_of), tuple(sorted(sharp_leaves)))
    if cache is not None and cache.fabric is not None and cache.fabric_key == fabric_key:
        fabric = cache.fabric
    else:
        fabric = leaf_fabric(leaf_of, sharp_leaves)
        if cache is not None:
            cache.fabric_key, cache.fabric, cache.view_key, cache.view = fabric_key, fabric, None, None
    models = tuple(nodes[n].gpus[0].model if nodes[n].gpus else "" for n in view.node_ids)
    view_key = (fabric_key, models, tuple(view.cluster.capacity), inputs.links_version, inputs.datasets_version)
    telemetry = inputs.telemetry
    if cache is not None and cache.view is not None and cache.view_key == view_key:
        placement = cache.view
        for n, host in placement.hosts.items():
            t = telemetry.get(n, IDLE)
            if host.telemetry is not t and host.telemetry != t:
                placement.replace_host(msgspec.structs.replace(host, telemetry=t))
        return placement
    hosts = [
        fw.HostState(
            name=n,
            gpu_model=models[h],
            total_gpus=view.cluster.capacity[h],
            free_gpus=view.cluster.free[h],
            telemetry=telemetry.get(n, IDLE),
        )
        for h, n in enumerate(view.node_ids)
    ]
    placement = fw.ClusterView(fabric, hosts, link_state=dict(inputs.node_links), datasets=inputs.datasets)
    if cache is not None:
        cache.view_key, cache.view = view_key, placement
    return placement


def hints_of(job: JobRecord) -> AskHints:
    """What placement reads of a job beyond its GPUs: a fraction (an inference share) is not
    compute-heavy; every whole-GPU job is."""
    return AskHints(gpu_model=job.gpu_model, dataset=job.dataset, compute_heavy=job.milli >= 1000)


def host_view(ledger: Ledger, taken: dict[str, set[int]], leaf_label: str, cache: FreeCache | None = None) -> HostView:
    """Ready nodes in id order; a GPU is free when it is ready, holds no grant and is not taken.
    `cache` (kept by the caller across cycles, for one `leaf_label`) only saves work: the view is
    the same without it."""
    node_ids: list[str] = []
    free_gpus: list[Sequence[int]] = []
    capacity: list[int] = []
    leaf_of: list[int] = []
    leaves: dict[str, int] = {}
    members: dict[int, int] = {}
    nodes = ledger.nodes
    for node_id in sorted(nodes):
        offer = offer_of(nodes[node_id], leaf_label, cache)
        if not offer.offered:
            continue
        held = taken.get(node_id)
        leaf = leaves.setdefault(offer.leaf, len(leaves))
        members[leaf] = members.get(leaf, 0) + 1
        node_ids.append(node_id)
        free_gpus.append([g for g in offer.free if g not in held] if held else offer.free)
        capacity.append(offer.capacity)
        leaf_of.append(leaf)
    return HostView(
        node_ids=node_ids,
        free_gpus=free_gpus,
        cluster=ClusterView(free=[len(f) for f in free_gpus], capacity=capacity, leaf_of=leaf_of),
        hosts_per_leaf=max(members.values(), default=1),
    )


def core_job(job: JobRecord) -> Job:
    return Job(
        id=job.job_id,
        tenant=job.tenant,
        gpus=job.gpus,
        nodes=job.hosts,
        priority=job.priority,
        submit_time=job.submitted_at.timestamp(),
        time_limit_s=job.time_limit_s,
        topology=job.topology,
    )


def running_job(job: JobRecord, index: dict[str, int], margin: float, now: float) -> RunningJob | None:
    """The core's picture of a job holding GPUs (or proposed: they are promised to it, and it starts
    now, so it is neither overrunning nor old enough to preempt), for backfill reservations and
    preemption; None when one of its nodes is not in the view."""
    per_host: dict[int, int] = {}
    for a in job.proposal if job.state == "proposed" else job.assignments:
        h = index.get(a.node_id)
        if h is None:
            return None
        per_host[h] = per_host.get(h, 0) + 1
    held_since = job.started_at or job.scheduled_at
    started = now if job.state == "proposed" or held_since is None else held_since.timestamp()
    core = core_job(job)
    return RunningJob(
        job=core,
        hosts=tuple(sorted(per_host.items())),
        started_at=started,
        planned_end=started + estimated_runtime(core, margin),
    )


def running_jobs(
    jobs: Sequence[JobRecord],
    index: dict[str, int],
    node_ids: list[str],
    margin: float,
    now: float,
    cache: PlanCache | None,
) -> list[RunningJob]:
    """`running_job` of every job holding or promised GPUs, reusing the cache's where still valid."""
    if cache is None:
        found = (running_job(j, index, margin, now) for j in jobs if j.holding or j.state == "proposed")
        return [r for r in found if r is not None]
    if cache.node_ids != node_ids:
        cache.node_ids, cache.running = node_ids, {}
    kept: dict[str, tuple[JobRecord, RunningJob]] = {}
    out: list[RunningJob] = []
    for j in jobs:
        if not (j.holding or j.state == "proposed"):
            continue
        hit = cache.running.get(j.job_id)
        r = hit[1] if hit is not None and hit[0] is j else running_job(j, index, margin, now)
        if r is None:
            continue
        out.append(r)
        # A proposed job, or one held since an unknown time, starts "now": not reusable.
        if j.holding and (j.started_at or j.scheduled_at) is not None:
            kept[j.job_id] = (j, r)
    cache.running = kept
    return out


QueueRule = tuple[QueuePolicy, CycleConfig]


def plan_cycle(
    ledger: Ledger,
    jobs: Sequence[JobRecord],
    now: dt.datetime,
    policy: QueuePolicy,
    config: CycleConfig,
    leaf_label: str,
    cache: PlanCache | None = None,
    *,
    placement: PlacementInputs = NO_PLACEMENT_INPUTS,
    queue_rules: Mapping[str, QueueRule] | None = None,
) -> CyclePlan:
    """Decide one cycle over the live `jobs` on `ledger`; see the module docstring and `PlanCache`.

    `placement`: the framework and what its plugins read (default: the core's `LeafPlacer`).
    `queue_rules`: queue -> its own (policy, cycle config); other queues use `policy`/`config`.
    With several queues waiting, each is decided by its own policy in turn on what the previous
    ones left, the queue whose oldest job has waited longest first (see `cycle_by_queue`).
    """
    view = host_view(ledger, taken_in_flight(ledger, jobs), leaf_label, cache.offers if cache else None)
    index = {n: i for i, n in enumerate(view.node_ids)}
    waiting = [j for j in jobs if j.state == "queued" and (j.not_before is None or j.not_before <= now)]
    running = running_jobs(jobs, index, view.node_ids, config.safety_margin, now.timestamp(), cache)
    placer: Placer | None = None
    if placement.framework is not None and view.node_ids:
        fw_view = placement_view(ledger, view, placement, cache)
        hints = {j.job_id: hints_of(j) for j in waiting if j.dataset or j.gpu_model or j.milli < 1000}
        placer = FrameworkPlacer(placement.framework, fw_view, view.node_ids, hints, now, placement.sample)
    groups: dict[str, list[Job]] = {}
    for j in waiting:
        groups.setdefault(j.queue, []).append(core_job(j))
    rules = queue_rules or {}
    order = sorted(groups, key=lambda q: (min(job.submit_time for job in groups[q]), q))
    cluster = view.cluster
    replies: list[SchedulingReply] = []
    waiting_why: dict[str, str] = {}
    for q in order or [""]:
        q_policy, q_config = rules.get(q, (policy, config))
        queue = groups.get(q, [])
        request = SchedulingRequest(
            now=now.timestamp(),
            queue=queue,
            running=running,
            cluster=cluster,
            policy=q_policy,
            config=msgspec.structs.replace(q_config, hosts_per_leaf=view.hosts_per_leaf),
            fairshare=placement.fairshare,
            placer=placer,
        )
        reply = schedule(request)
        replies.append(reply)
        waiting_why.update(explain_head(reply, request, queue))
        if len(order) > 1:
            cluster, running = after(reply, request)
    reply = merged(replies)
    if isinstance(placer, FrameworkPlacer):
        # Say what the plugins found missing when no future frees it (a GPU model, a dataset's holders).
        for job_id, why in waiting_why.items():
            if why.endswith(NEVER_FITS) and (found := placer.reasons.get(job_id)):
                waiting_why[job_id] = f"{why} ({found})"
    return CyclePlan(
        ledger_version=ledger.version,
        proposals=assign(reply, view, {j.job_id: j for j in jobs}),
        preempted=[(p.job_id, p.for_job_id) for p in reply.preemptions],
        killed=list(reply.kills),
        waiting=waiting_why,
        order=reply.order,
    )


def after(reply: SchedulingReply, request: SchedulingRequest) -> tuple[ClusterView, list[RunningJob]]:
    """The cluster and the running jobs once `reply` is carried out: kills and preemptions free
    their GPUs, starts take theirs (for the next queue of the same cycle)."""
    free = list(request.cluster.free)
    gone = set(reply.kills) | {p.job_id for p in reply.preemptions}
    running = []
    for r in request.running:
        if r.job.id in gone:
            for h, g in r.hosts:
                free[h] += g
        else:
            running.append(r)
    by_id = {j.id: j for j in request.queue}
    for start in reply.starts:
        for h, g in start.hosts:
            free[h] -= g
        running.append(
            RunningJob(
                job=by_id[start.job_id],
                hosts=tuple(start.hosts),
                started_at=request.now,
                planned_end=start.planned_end,
            )
        )
    return msgspec.structs.replace(request.cluster, free=free), running


def merged(replies: Sequence[SchedulingReply]) -> SchedulingReply:
    if len(replies) == 1:
        return replies[0]
    starts: list[Start] = []
    preemptions: list[Preemption] = []
    kills: list[str] = []
    waiting: dict[str, str] = {}
    for r in replies:
        starts.extend(r.starts)
        preemptions.extend(r.preemptions)
        kills.extend(k for k in r.kills if k not in kills)
        waiting.update(r.waiting)
    return SchedulingReply(
        order=",".join(r.order for r in replies), starts=starts, preemptions=preemptions, kills=kills, waiting=waiting
    )


def explain_head(reply: SchedulingReply, request: SchedulingRequest, queue: Sequence[Job]) -> dict[str, str]:
    """The reply's reasons, with an earliest estimated start for the first job told only "no free GPUs".

    The core reserves for the head only when some GPU is free; a full cluster leaves the head
    without an estimate. Here it is reserved as the core would: on the view after this cycle's
    starts, releasing running jobs (this cycle's starts included) by their planned end.
    """
    waiting = dict(reply.waiting)
    head_id = next((job_id for job_id, why in waiting.items() if why == NO_FREE_GPUS), None)
    head = next((j for j in queue if j.id == head_id), None)
    if head is None or reply.preemptions or reply.kills:
        return waiting
    by_id = {j.id: j for j in queue}
    free = FreeView.of(request.cluster)
    running = list(request.running)
    for start in reply.starts:
        free.apply(start.hosts)
        running.append(
            RunningJob(
                job=by_id[start.job_id], hosts=tuple(start.hosts), started_at=request.now, planned_end=start.planned_end
            )
        )
    max_leaves = None
    if head.nodes > 1 and not (
        head.topology == "preferred" and request.now - head.submit_time >= request.config.span_relax_after_s
    ):
        max_leaves = min_leaf_span(head.nodes, request.config.hosts_per_leaf)
    placer = request.placer if request.placer is not None else LeafPlacer()
    found = reserve(free, running, head, request.now, placer, max_leaves=max_leaves)
    if found is not None:
        span = max_leaves or "any number of"
        needs = (
            f"{head.gpus} GPUs on one host"
            if head.nodes <= 1
            else f"{head.nodes} hosts with {host_shares(head)[0]} free GPUs under {span} leaves"
        )
        start_at = dt.datetime.fromtimestamp(found[0].start_at, dt.UTC).strftime("%Y-%m-%d %H:%M")
        waiting[head.id] = f"waiting for {needs}; earliest estimated start {start_at}"
    return waiting


def assign(reply: SchedulingReply, view: HostView, jobs: dict[str, JobRecord]) -> list[Proposal]:
    """The exact GPUs of every start: the lowest free indices of each host the core chose, counting
    the GPUs of the jobs this cycle preempts or kills as free (the core gave them to the starts)."""
    # Only the hosts a start or a victim touches are copied and sorted (a cycle touches few of 1,000).
    free: dict[int, list[int]] = {}

    def free_on(host: int) -> list[int]:
        if host not in free:
            free[host] = sorted(view.free_gpus[host])
        return free[host]

    index = {n: i for i, n in enumerate(view.node_ids)}
    for gone in [p.job_id for p in reply.preemptions] + list(reply.kills):
        for a in jobs[gone].assignments:
            if (h := index.get(a.node_id)) is not None:
                free_on(h).append(a.gpu_index)
                free[h].sort()
    out: list[Proposal] = []
    for start in reply.starts:
        job = jobs[start.job_id]
        fraction = job.milli < 1000
        assignments: list[GpuAssignment] = []
        for host, count in start.hosts:
            picked, free[host] = free_on(host)[:count], free[host][count:]
            assignments.extend(
                GpuAssignment(
                    node_id=view.node_ids[host],
                    gpu_index=g,
                    milli=job.milli,
                    memory_mib=job.memory_mib if fraction else None,
                )
                for g in picked
            )
        out.append(Proposal(job_id=job.job_id, assignments=assignments))
    return out
