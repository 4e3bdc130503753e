"""The scheduler service's cycle: the pool as the ledger replica shows it + the live jobs ->
`plan()` -> exact GPUs. Pure.

The decision is `ibpool_core.sched.plan.plan`, on dense host indices and GPU counts, the same the
simulator makes; this module builds its request from the ledger (ready nodes, whole free GPUs of
ready GPUs, the published fabric's leaf groups, the sites) and maps its starts back to node ids and
GPU indices, the exact assignment a `ProposePlacement` carries. GPUs are counted as taken when the
ledger holds a grant on them, and also while the ledger replica has not seen yet what the
scheduler already knows: a proposal in flight, or a grant the replica has not folded in.

The live jobs come as a list, or as a `LiveBook` kept by their changes (the service's), and the
telemetry as a mapping or a `ChangedMap`: with a `PlanCache`, a cycle on a book reads what changed
since the last (`HeldRuns`, `refresh_telemetry`) and gives the plan a walk over `list(book)` gives.

`job_changes` turns a plan into records and commands. A `ProposePlacement`'s id (also the allocation
id of its grant) derives from the proposal (`ibpool_core.ids.event_id`): the job, its attempt and
rejections so far (a new proposal of the job each time), the scheduler group and fencing term, and
the ledger version it was computed on; the same cycle on the same input proposes the same command.
"""

from __future__ import annotations

import datetime as dt
import heapq
from bisect import bisect_right, insort
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import msgspec

from ibpool_core.fabric.index import FabricIndex
from ibpool_core.fabric.link_health import LinkState
from ibpool_core.fabric.view import FabricState
from ibpool_core.ids import event_id
from ibpool_core.pool import mig
from ibpool_core.pool.ledger import Allocation, Ledger, Node, allocation_changes, node_changes
from ibpool_core.sched import framework as fw
from ibpool_core.sched import lifecycle, records
from ibpool_core.sched.book import HOLDING_OR_PROPOSED, ChangedMap, LiveBook, Ordered
from ibpool_core.sched.cycle import CycleConfig
from ibpool_core.sched.framework_placer import AskHints, FrameworkPlacer, leaf_fabric
from ibpool_core.sched.jobs import FreeCapacity, Job, RunningJob, estimated_runtime
from ibpool_core.sched.placer import FreeView, Placer
from ibpool_core.sched.plan import PlanReply, PlanRequest, QueueRequest, plan
from ibpool_core.sched.queueing import QueuePolicy
from ibpool_core.sched.records import HOLDING, JobPlacement, JobRecord, avoided
from ibpool_core.sched.runtime import RuntimeEstimate
from ibpool_core.sched.sharp import SharpLimits, SharpTree
from ibpool_core.sched.sites import Site, SiteChoice, choose_site
from ibpool_core.sched.waits import Wait
from ibpool_proto.message import Message
from ibpool_proto.pool import GpuAssignment, ProposePlacement

UNLABELLED_LEAF = ""
# The leaf of a node the published fabric does not have: a group of its own (single-host work only).
OFF_FABRIC = "off-fabric:"


class LeafSource:
    """Where a node's leaf group comes from: the published fabric (`fabric`: its leaf groups; a node
    it does not have is a group of its own) or, while no fabric was ever published, the node label
    `label` (unlabelled nodes share one group). A new source for every new fabric version: the
    caches of `host_view_cached` are keyed by it."""

    __slots__ = ("fabric", "label")

    def __init__(self, label: str, fabric: FabricState | None = None) -> None:
        self.label = label
        self.fabric = fabric

    def leaf(self, node: Node) -> str:
        if self.fabric is not None:
            group = self.fabric.leaf_of.get(node.node_id)
            return group if group is not None else OFF_FABRIC + node.node_id
        return node.labels.get(self.label, UNLABELLED_LEAF)

    def same(self, other: LeafSource) -> bool:
        return self.label == other.label and self.fabric is other.fabric


class Proposal(msgspec.Struct, frozen=True, kw_only=True):
    """One start: its exact GPUs, host by host in rank order, and how it is placed (`placement`:
    the hosts in rank order, SHARP on or off and why, the NCCL settings that turn it on, the fabric
    version and tier it was decided on, its SHARP trees; what the job records)."""

    job_id: str
    assignments: list[GpuAssignment]
    placement: JobPlacement = JobPlacement()

    @property
    def ranks(self) -> list[str]:
        return self.placement.ranks

    @property
    def sharp(self) -> bool:
        return self.placement.sharp

    @property
    def sharp_reason(self) -> str:
        return self.placement.sharp_reason

    @property
    def nccl_env(self) -> dict[str, str]:
        return self.placement.nccl_env

    @property
    def tier(self) -> int | None:
        return self.placement.tier


class CyclePlan(msgspec.Struct, frozen=True, kw_only=True):
    """What to do after one cycle, by job id, on the ledger version the view was built from."""

    ledger_version: int
    proposals: list[Proposal] = []
    preempted: list[tuple[str, str]] = []  # (victim, for whom)
    killed: list[str] = []
    waiting: dict[str, Wait] = {}
    order: str = ""
    # job id -> (the site chosen for it this cycle, None: fits none it names; why)
    sites: dict[str, tuple[str | None, str]] = {}

    def preempted_ids(self) -> list[str]:
        return [victim for victim, _ in self.preempted]

    def commits_durably(self, replacing: bool) -> bool:
        """Whether the cycle's commit must wait for the disk (`state.commit_durably`): it preempts,
        kills at the time limit or (`replacing`) replaces gang members, whose events cannot be taken
        back by planning again. A cycle that only proposes, waits or chooses sites need not
        (`state.lock_cycle` says why a lost one is harmless)."""
        return bool(self.preempted or self.killed or replacing)


class HostView(msgspec.Struct, frozen=True, kw_only=True):
    """The cycle's hosts: index -> node id, the free GPU indices of each, and the core's view."""

    node_ids: list[str]
    free_gpus: list[Sequence[int]]  # not to be changed: unchanged nodes share them with the next cycle
    cluster: FreeCapacity
    hosts_per_leaf: int


def taken_in_flight(ledger: Ledger, jobs: Iterable[JobRecord]) -> dict[str, set[int]]:
    """GPUs the scheduler holds that the ledger replica does not show yet, per node: a proposal the
    ledger has not granted, a grant it does not show (yet, or any more), a member's replacement in
    flight. The `InFlight` of `jobs` (one rule, kept or built at once)."""
    index = InFlight()
    for job in jobs:
        index.add(job)
    return index.taken(ledger)


class InFlight:
    """The jobs whose GPUs may be in flight, kept as live jobs come and go: `add` a job's record,
    `remove` it when the record is replaced or the job ends. `taken(ledger)` needs no walk over
    every held job: the held jobs whose grant the ledger does not show yet are kept as a set,
    brought up to date by the allocations the ledger changed since the last call (its
    `allocation_changes` log) and the jobs added since (a ledger without that past is compared
    whole, a set difference of allocation ids); only the proposed ones are looked at one by one.
    (An allocation id belongs to one job: it is the id of that job's proposal.)"""

    def __init__(self) -> None:
        self._proposed: dict[str, JobRecord] = {}  # job id -> a proposed job
        self._held: dict[str, JobRecord] = {}  # allocation id -> a held job
        self._held_unnamed: dict[str, JobRecord] = {}  # job id -> a held job with no allocation id
        self._replacement_proposed: dict[str, JobRecord] = {}  # job id -> a held job whose member's
        # replacement is in flight: its GPUs are promised
        self._missing: set[str] = set()  # allocation ids of `_held` the ledger did not show at `_seen`
        self._fresh: set[str] = set()  # allocation ids added to `_held` since the last `taken`
        self._seen: tuple[object, int] | None = None  # the ledger's allocation log, as read

    def add(self, job: JobRecord) -> None:
        if job.state == "proposed":
            self._proposed[job.job_id] = job
        elif job.state in HOLDING:
            if job.allocation_id is None:
                self._held_unnamed[job.job_id] = job
            else:
                self._held[job.allocation_id] = job
                self._fresh.add(job.allocation_id)
            if job.replace_id is not None:
                self._replacement_proposed[job.job_id] = job

    def remove(self, job: JobRecord) -> None:
        """Forget `job`, a record `add`ed before."""
        self._proposed.pop(job.job_id, None)
        self._held_unnamed.pop(job.job_id, None)
        self._replacement_proposed.pop(job.job_id, None)
        if job.allocation_id is not None and (held := self._held.get(job.allocation_id)) is not None:
            if held.job_id == job.job_id:
                del self._held[job.allocation_id]
                self._missing.discard(job.allocation_id)
                self._fresh.discard(job.allocation_id)

    def taken(self, ledger: Ledger) -> dict[str, set[int]]:
        taken: dict[str, set[int]] = {}

        def take(assignments: Sequence[GpuAssignment]) -> None:
            for a in assignments:
                taken.setdefault(a.node_id, set()).add(a.gpu_index)

        allocations = ledger.allocations
        for job in self._proposed.values():
            if job.proposal_id not in allocations:
                take(job.proposal)
        held, missing = self._held, self._missing
        log = allocation_changes(ledger)
        changed = log.changes_since(*self._seen) if self._seen is not None else None
        if changed is None:
            missing.clear()
            if not held.keys() <= allocations.keys():  # the granted ones found without a set built
                missing.update(held.keys() - allocations.keys())
        else:
            for allocation_id in (*changed, *self._fresh):
                if allocation_id not in held:
                    continue
                if allocation_id in allocations:
                    missing.discard(allocation_id)
                else:
                    missing.add(allocation_id)
        self._fresh.clear()
        self._seen = (log.token, log.version)
        for allocation_id in missing:
            take(held[allocation_id].assignments)
        for job in self._held_unnamed.values():
            take(job.assignments)
        for job in self._replacement_proposed.values():
            take(job.replace_proposal)
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


def offer_of(node: Node, leaves: LeafSource, cache: FreeCache | None) -> NodeOffer:
    if cache is not None and (hit := cache.get(node.node_id)) is not None and hit[0] is node:
        return hit[1]
    offer = NodeOffer(
        # A leaf-cordoned node (a degraded leaf link) is left out for every job here, single-node ones
        # too: the allocator would take those, but the cycle's view has no per-job node filter yet.
        offered=node.ready_for(multi_node=True) and bool(node.gpus),
        free=tuple(g.index for g in node.gpus if g.ready and g.fits_whole() and not g.mig),
        capacity=len(node.gpus),
        leaf=leaves.leaf(node),
    )
    if cache is not None:
        cache[node.node_id] = (node, offer)
    return offer


class PlanCache:
    """Work one cycle can hand to the next; never changes a plan (the same plan without it).

    `offers`: see `FreeCache`. `running`: job id -> (its record, the core's RunningJob) of jobs that
    hold GPUs since a known time; reused while the record is the same object (`state.live_jobs`
    returns the same record for an unchanged row) and the hosts are the same list (`node_ids`);
    `promised` the same for proposed jobs, whose start time is renewed every cycle; `held` the same
    for the jobs of a `LiveBook`, kept by its changes (`HeldRuns`). `layout`: the last host view
    (`host_view_cached`) and its free view. The placement view, its fabric and its placer are kept
    while their inputs hold (`placement_view`, `framework_placer`).
    """

    def __init__(self) -> None:
        self.offers: FreeCache = {}
        self.node_ids: list[str] = []
        self.running: dict[str, tuple[JobRecord, RunningJob]] = {}
        # The placement view (framework.FreeCapacity) and the fabric it sits on, while their inputs hold.
        self.fabric_key: object = None
        self.fabric: FabricIndex | None = None
        self.view_key: object = None
        self.view: fw.ClusterView | None = None
        # The last host view and what it was built from, so the next one changes only the hosts whose
        # node changed or whose GPUs in flight changed (`host_view_cached`).
        self.layout: Layout | None = None
        # The host lists (node ids, leaves, capacities) the placement view was built for, by identity:
        # `host_view_cached` keeps them while no host's layout changes, so the key needs no O(hosts) work.
        self.lists: tuple[object, ...] = ()
        self.inputs_key: object = None
        # Hosts of the placement view whose telemetry may not be the idle default.
        self.telemetry_hosts: set[str] = set()
        # The (token, version) of the telemetry's change log the view was last brought to, when the
        # telemetry came as a `ChangedMap`.
        self.telemetry_seen: tuple[object, int] | None = None
        # Job id -> (its record, the core's job, its hosts, its estimated runtime) of proposed jobs (and
        # held ones since an unknown time), which start "now" every cycle: all but the time is reused.
        self.promised: dict[str, tuple[JobRecord, RunningJob | None, float]] = {}
        self.margin: float | None = None
        # Node id -> host index of `node_ids` (the same list object).
        self.index: tuple[list[str], dict[str, int]] | None = None
        # The placer of the last cycle, reused while its view, hosts, framework and sample hold.
        self.placer: FrameworkPlacer | None = None
        self.placer_key: tuple[object, ...] = ()
        # The running jobs of a `LiveBook`, kept by its changes.
        self.held: HeldRuns | None = None


DEFAULT_SHARP_LIMITS = SharpLimits()


class PlacementInputs:
    """What the framework's plugins read besides the ledger, for one cycle.

    framework   the built profile (None: the core's `LeafPlacer` places)
    fabric      the published fabric in force (None: the node labels are the fabric, `leaf_fabric`)
    telemetry   node id -> its newest telemetry (absent: idle and cool)
    node_links  where link health falls (absent: up): with a fabric, host name or leaf GUID ->
                worst state (`FabricState.link_health`); without, node id -> the worst state of
                its own adapters' links; `links_version` changes with it
    datasets    dataset -> node ids holding it; `datasets_version` changes with it
    sharp_label node label whose value "true" puts the node under a SHARP-capable leaf
    site_label  node label naming the node's site, for jobs that name sites (`JobRecord.sites`)
    site_transfer_s  what choosing a site without the job's dataset costs it (copying the data), s
    sample      hosts scored per single-host job (0: all)
    fairshare   tenant -> fair-share factor (`ibpool_core.sched.fairshare`), read by the policies
    sharp_limits, sharp_held   how many SHARP trees the fabric runs at once, and the trees the live
                jobs hold, by job id (`ibpool_core.sched.sharp.SharpTrees`)
    """

    def __init__(
        self,
        framework: fw.Framework | None = None,
        *,
        fabric: FabricState | None = None,
        telemetry: Mapping[str, fw.Telemetry] | None = None,
        node_links: Mapping[str, LinkState] | None = None,
        links_version: int = 0,
        datasets: Mapping[str, Collection[str]] | None = None,
        datasets_version: int = 0,
        sharp_label: str = "ibpool.io/sharp",
        site_label: str = "ibpool.io/site",
        site_transfer_s: float = 600.0,
        sample: int = 0,
        fairshare: Mapping[str, float] | None = None,
        sharp_limits: SharpLimits = DEFAULT_SHARP_LIMITS,
        sharp_held: Mapping[str, SharpTree] | None = None,
    ) -> None:
        self.framework = framework
        self.fabric = fabric
        self.telemetry = telemetry or {}
        self.node_links = node_links or {}
        self.links_version = links_version
        self.datasets = datasets or {}
        self.datasets_version = datasets_version
        self.sharp_label = sharp_label
        self.site_label = site_label
        self.site_transfer_s = site_transfer_s
        self.sample = sample
        self.fairshare = fairshare or {}
        self.sharp_limits = sharp_limits
        self.sharp_held = sharp_held or {}


NO_PLACEMENT_INPUTS = PlacementInputs()
IDLE = fw.Telemetry()


def placement_view(ledger: Ledger, view: HostView, inputs: PlacementInputs, cache: PlanCache | None) -> fw.ClusterView:
    """The framework's view of the cycle's hosts: the published fabric (a host it does not have is a
    group of its own) or, while none is, the fabric of their label leaves (`leaf_fabric`); GPU
    models, telemetry, link states and datasets; reused from `cache` while those inputs hold
    (telemetry is refreshed in place; free GPUs are brought in step by `FrameworkPlacer` before each
    placement)."""
    lists = (view.node_ids, view.cluster.leaf_of, view.cluster.capacity)
    inputs_key = (inputs.sharp_label, inputs.links_version, inputs.datasets_version, inputs.fabric)
    if (
        cache is not None
        and cache.view is not None
        and cache.inputs_key == inputs_key
        and len(cache.lists) == len(lists)
        and all(a is b for a, b in zip(lists, cache.lists, strict=True))
    ):
        # The same host lists as the view was last checked against: `host_view_cached` keeps them only
        # while no node's leaf, labels, GPU model or count changed, so the full key below would match.
        refresh_telemetry(cache.view, inputs.telemetry, cache)
        return cache.view
    nodes = ledger.nodes
    fabric_key: tuple[object, ...]
    if inputs.fabric is not None:
        fabric = inputs.fabric.index
        fabric_key = (inputs.fabric, tuple(view.node_ids))
    else:
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
    if cache is not None and cache.fabric_key != fabric_key:
        cache.fabric_key, cache.fabric, cache.view_key, cache.view = fabric_key, fabric, None, None
    models = tuple(nodes[n].gpus[0].model if nodes[n].gpus else "" for n in view.node_ids)
    view_key = (fabric_key, models, tuple(view.cluster.capacity), inputs.links_version, inputs.datasets_version)
    telemetry = inputs.telemetry
    if cache is not None and cache.view is not None and cache.view_key == view_key:
        cache.lists, cache.inputs_key = lists, inputs_key
        refresh_telemetry(cache.view, telemetry, cache)
        return cache.view
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
    placement = fw.ClusterView(
        fabric,
        hosts,
        link_state=dict(inputs.node_links),
        datasets=inputs.datasets,
        off_fabric=inputs.fabric is not None,
    )
    if cache is not None:
        cache.view_key, cache.view = view_key, placement
        cache.lists, cache.inputs_key = lists, inputs_key
        cache.telemetry_hosts = {n for n in telemetry if n in placement.hosts}
        note_telemetry_seen(telemetry, cache)
    return placement


def refresh_telemetry(view: fw.ClusterView, telemetry: Mapping[str, fw.Telemetry], cache: PlanCache) -> None:
    """Give every host of `view` its telemetry of `telemetry` (absent: idle), touching only the hosts
    named there and those that had telemetry before (`PlanCache.telemetry_hosts`), not every host;
    of a `ChangedMap` seen before, only the hosts whose telemetry changed since."""
    hosts = view.hosts
    marked = cache.telemetry_hosts
    seen = cache.telemetry_seen
    changed = telemetry.log.changes_since(*seen) if isinstance(telemetry, ChangedMap) and seen is not None else None
    names = telemetry.keys() if changed is None else dict.fromkeys(changed)
    for n in names:
        host = hosts.get(n)
        t = telemetry.get(n)
        if host is None:
            continue
        if t is None:
            marked.discard(n)
            t = IDLE
        else:
            marked.add(n)
        if host.telemetry is not t and host.telemetry != t:
            view.replace_host(msgspec.structs.replace(host, telemetry=t))
    if changed is None:
        for n in [n for n in marked if n not in telemetry]:
            host = hosts[n]
            if host.telemetry is not IDLE and host.telemetry != IDLE:
                view.replace_host(msgspec.structs.replace(host, telemetry=IDLE))
            marked.discard(n)
    note_telemetry_seen(telemetry, cache)


def note_telemetry_seen(telemetry: Mapping[str, fw.Telemetry], cache: PlanCache) -> None:
    cache.telemetry_seen = (telemetry.log.token, telemetry.log.version) if isinstance(telemetry, ChangedMap) else None


def allowed_hosts(job: JobRecord, sites: SitePlan, node_ids: Sequence[str], now: dt.datetime) -> frozenset[str] | None:
    """The hosts `job` may take this cycle: its site's (`SitePlan.hosts_for`) without the node a
    failure just took it from (`records.avoided`); None: any."""
    hosts = sites.hosts_for(job)
    avoid = avoided(job, now)
    if not avoid:
        return hosts
    return (frozenset(node_ids) if hosts is None else hosts) - avoid


def mig_hosts(ledger: Ledger, profile: str) -> frozenset[str]:
    """The nodes whose every GPU can run MIG `profile`: a MIG job's GPU is the lowest free one of its
    host (`assign`), so each of them must be able to."""
    return frozenset(
        n.node_id
        for n in ledger.nodes.values()
        if n.gpus and all(g.mig_capable and profile in mig.MIG_PROFILES.get(g.model, {}) for g in n.gpus)
    )


def mig_hosts_cached(ledger: Ledger, profile: str, cache: PlanCache | None) -> frozenset[str]:
    """`mig_hosts`, kept with the cache's host layout (rebuilt when any node's GPU models or MIG
    capability change, `_layout_key`), so a MIG job waiting costs no walk over every node per cycle."""
    layout = cache.layout if cache is not None else None
    if layout is None:
        return mig_hosts(ledger, profile)
    hit = layout.mig.get(profile)
    if hit is None:
        hit = layout.mig[profile] = mig_hosts(ledger, profile)
    return hit


def _and(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    """Both host limits (None: no limit)."""
    return b if a is None else a if b is None else a & b


def hints_of(job: JobRecord, hosts: frozenset[str] | None = None) -> AskHints:
    """What placement reads of a job beyond its GPUs: a fraction (an inference share) is not
    compute-heavy; every whole-GPU job is. `hosts`: the only hosts it may take (its site's)."""
    return AskHints(gpu_model=job.gpu_model, dataset=job.dataset, compute_heavy=job.milli >= 1000, hosts=hosts)


class SitePlan(msgspec.Struct, frozen=True, kw_only=True):
    """The sites of one cycle: site -> its hosts (node ids), and the site chosen this cycle for each
    waiting job that names sites and has none yet (`choice.site` None: it fits none of them)."""

    hosts: dict[str, frozenset[str]] = {}
    chosen: dict[str, SiteChoice] = {}

    def site_of(self, job: JobRecord) -> str | None:
        if job.site is not None:
            return job.site
        choice = self.chosen.get(job.job_id)
        return choice.site if choice is not None else None

    def hosts_for(self, job: JobRecord) -> frozenset[str] | None:
        """The hosts `job` may take: its site's (none while it has no site); None when it names no site."""
        if not job.sites:
            return None
        site = self.site_of(job)
        return self.hosts.get(site, frozenset()) if site is not None else frozenset()


NO_SITES = SitePlan()


def plan_sites(
    ledger: Ledger,
    view: HostView,
    waiting: Sequence[JobRecord],
    running: Sequence[RunningJob],
    inputs: PlacementInputs,
    now: float,
    margin: float,
) -> SitePlan:
    """Choose a site (`ibpool_core.sched.sites.choose_site`) for every waiting job that names sites
    and has none yet, in submit order, each seeing the jobs already bound to a site queued there.

    A site is the set of the cycle's hosts whose `site_label` names it; it holds a dataset when one
    of its hosts does (the registry). A running job counts at the site of its hosts.
    """
    if not any(j.sites for j in waiting):
        return NO_SITES
    nodes = ledger.nodes
    members: dict[str, list[int]] = {}
    for h, node_id in enumerate(view.node_ids):
        members.setdefault(nodes[node_id].labels.get(inputs.site_label, ""), []).append(h)
    hosts = {s: frozenset(view.node_ids[h] for h in hs) for s, hs in members.items()}
    queued: dict[str, list[Job]] = {}
    in_order = sorted(waiting, key=lambda j: (j.submitted_at, j.job_id))
    for j in in_order:
        if j.sites and j.site is not None:
            queued.setdefault(j.site, []).append(core_job(j))
    cluster = view.cluster

    def site(name: str) -> Site:
        hs = members.get(name, [])
        local = {h: i for i, h in enumerate(hs)}
        return Site(
            name=name,
            cluster=FreeCapacity(
                free=[cluster.free[h] for h in hs],
                capacity=[cluster.capacity[h] for h in hs],
                leaf_of=[cluster.leaf_of[h] for h in hs],
            ),
            running=[
                msgspec.structs.replace(r, hosts=tuple((local[h], g) for h, g in r.hosts))
                for r in running
                if all(h in local for h, _ in r.hosts)
            ],
            queue=queued.get(name, []),
            datasets=frozenset(
                ds for ds, holders in inputs.datasets.items() if not hosts.get(name, frozenset()).isdisjoint(holders)
            ),
            hosts_per_leaf=view.hosts_per_leaf,
        )

    chosen: dict[str, SiteChoice] = {}
    for j in in_order:
        if not j.sites or j.site is not None:
            continue
        job = core_job(j)
        choice = choose_site(
            job,
            [site(s) for s in j.sites],
            now,
            dataset=j.dataset,
            transfer_s=inputs.site_transfer_s,
            safety_margin=margin,
        )
        chosen[j.job_id] = choice
        if choice.site is not None:
            queued.setdefault(choice.site, []).append(job)
    return SitePlan(hosts=hosts, chosen=chosen)


def host_view(
    ledger: Ledger, taken: dict[str, set[int]], leaves: LeafSource, cache: FreeCache | None = None
) -> HostView:
    """Ready nodes in id order; a GPU is free when it is ready, holds no grant and is not taken.
    `cache` (kept by the caller across cycles, for one `leaves`) only saves work: the view is
    the same without it."""
    node_ids: list[str] = []
    free_gpus: list[Sequence[int]] = []
    capacity: list[int] = []
    leaf_of: list[int] = []
    numbers: dict[str, int] = {}  # leaf name -> its index
    members: dict[int, int] = {}
    nodes = ledger.nodes
    for node_id in sorted(nodes):
        offer = offer_of(nodes[node_id], leaves, cache)
        if not offer.offered:
            continue
        held = taken.get(node_id)
        leaf = numbers.setdefault(offer.leaf, len(numbers))
        members[leaf] = members.get(leaf, 0) + 1
        node_ids.append(node_id)
        free_gpus.append([g for g in offer.free if g not in held] if held else offer.free)
        capacity.append(offer.capacity)
        leaf_of.append(leaf)
    return HostView(
        node_ids=node_ids,
        free_gpus=free_gpus,
        cluster=FreeCapacity(free=[len(f) for f in free_gpus], capacity=capacity, leaf_of=leaf_of),
        hosts_per_leaf=max(members.values(), default=1),
    )


def _layout_key(node: Node, offer: NodeOffer) -> tuple[object, ...]:
    """What of a node shapes the cycle's host lists, the placement view and the MIG-capable hosts
    (all but its free GPUs): its GPUs' models and MIG capability change only with its hardware
    (`Node.inventory_version`)."""
    model = node.gpus[0].model if node.gpus else ""
    return (offer.offered, offer.leaf, offer.capacity, node.labels, model, node.inventory_version)


class Layout:
    """The last host view of `host_view_cached` and what it was built from.

    ids    every node id of the ledger, sorted (`index`: node id -> position); `nodes` the node of
           each as last seen and `keys` its `_layout_key` when the view's host lists were built;
           `seen` the (token, version) of the ledger's `node_changes` they were brought to
    base   per host index, its offer's free GPUs (before the GPUs in flight are taken out)
    pos    node id -> host index (offered nodes only); `taken` the hosts with GPUs in flight last time
    free_view  `FreeView.of(view.cluster)`, kept in step with the view host by host; a cycle borrows
           it (`plan_cycle`) and gives it back as it was
    mig    MIG profile -> the hosts whose every GPU can run it (`mig_hosts_cached`), as asked
    """

    __slots__ = ("base", "free_view", "ids", "index", "keys", "leaves", "mig", "nodes", "pos", "seen", "taken", "view")

    def __init__(self, ledger: Ledger, leaves: LeafSource, taken: dict[str, set[int]], cache: FreeCache) -> None:
        self.leaves = leaves
        self.view = host_view(ledger, taken, leaves, cache)
        nodes = ledger.nodes
        self.ids = sorted(nodes)
        known = [nodes[n] for n in self.ids]
        self.keys = [_layout_key(node, offer_of(node, leaves, cache)) for node in known]
        self.nodes: list[Node | None] = list(known)
        self.pos = {n: h for h, n in enumerate(self.view.node_ids)}
        self.base: list[Sequence[int]] = [cache[n][1].free for n in self.view.node_ids]
        self.taken = {n for n in taken if n in self.pos}
        self.free_view = FreeView.of(self.view.cluster)
        self.mig: dict[str, frozenset[str]] = {}  # MIG profile -> `mig_hosts`, while no layout changes
        self.index = {n: i for i, n in enumerate(self.ids)}
        log = node_changes(ledger)
        self.seen: tuple[object, int] = (log.token, log.version)  # the ledger's node log, as read


_CHUNK = 64


def host_view_cached(ledger: Ledger, taken: dict[str, set[int]], leaves: LeafSource, cache: PlanCache) -> HostView:
    """`host_view(ledger, taken, leaves)`, computed from the last cycle's: only the hosts whose node
    changed (the ledger replaces a node on every change; its `node_changes` log names them, or,
    for a ledger without that past, every node is compared with the one last seen) or whose GPUs in
    flight changed are redone, in place, and while no node's layout (`_layout_key`) changed the view
    keeps the same host lists, node ids, leaves and capacities (the same list objects, which
    `placement_view` keys on). Any change of the node set or of a layout rebuilds it."""
    st = cache.layout
    nodes = ledger.nodes
    if st is None or not st.leaves.same(leaves) or len(nodes) != len(st.ids):
        if st is not None and not st.leaves.same(leaves):
            cache.offers.clear()  # their leaves are the old source's
        cache.layout = Layout(ledger, leaves, taken, cache.offers)
        return cache.layout.view
    ids, prev, pos, base = st.ids, st.nodes, st.pos, st.base
    dirty: set[int] = set()

    def changed(i: int, node: Node | None) -> bool:
        """Take in the node at `i`; False when the view must be rebuilt."""
        if node is None:  # a node left and another came: the node set changed
            return False
        offer = offer_of(node, leaves, cache.offers)
        if _layout_key(node, offer) != st.keys[i]:
            return False
        prev[i] = node
        if offer.offered:
            h = pos[ids[i]]
            base[h] = offer.free
            dirty.add(h)
        return True

    log = node_changes(ledger)
    names = log.changes_since(*st.seen)
    if names is not None:
        index = st.index
        for node_id in dict.fromkeys(names):
            i = index.get(node_id)
            node = nodes.get(node_id)
            if node is not None and i is not None and node is prev[i]:
                continue
            if i is None or not changed(i, node):
                cache.layout = Layout(ledger, leaves, taken, cache.offers)
                return cache.layout.view
    else:
        current = list(map(nodes.get, ids))
        n = len(current)
        # Compare in chunks (C speed), walk only those that differ.
        for lo in range(0, n, _CHUNK):
            hi = lo + _CHUNK
            if current[lo:hi] == prev[lo:hi]:
                continue
            for i in range(lo, min(hi, n)):
                if current[i] is not prev[i] and not changed(i, current[i]):
                    cache.layout = Layout(ledger, leaves, taken, cache.offers)
                    return cache.layout.view
    st.seen = (log.token, log.version)
    dirty.update(pos[n] for n in st.taken)
    dirty.update(pos[n] for n in taken if n in pos)
    st.taken = {n for n in taken if n in pos}
    if not dirty:
        return st.view
    view = st.view
    free_gpus, free, node_ids = view.free_gpus, view.cluster.free, view.node_ids
    free_view = st.free_view
    for h in dirty:
        held = taken.get(node_ids[h])
        offered = base[h]
        free_gpus[h] = got = [g for g in offered if g not in held] if held else offered
        free[h] = len(got)
        free_view.set_free(h, free[h])
    return view


def core_job(job: JobRecord, predicted: RuntimeEstimate | None = None) -> Job:
    """The core's job; `predicted` (this cycle's prediction) else the one the record carries."""
    if predicted is None and job.predicted is not None:
        predicted = RuntimeEstimate(p50=job.predicted.p50_s, p90=job.predicted.p90_s)
    return Job(
        id=job.job_id,
        tenant=job.tenant,
        gpus=job.gpus,
        hosts=job.hosts,
        priority=job.priority,
        submit_time=job.submitted_at.timestamp(),
        time_limit_s=job.time_limit_s,
        topology=job.topology,
        topology_level=job.topology_level,
        predicted=predicted,
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
    if (cache.node_ids is not node_ids and cache.node_ids != node_ids) or cache.margin != margin:
        cache.node_ids, cache.running, cache.promised, cache.margin = node_ids, {}, {}, margin
    running, promised = cache.running, cache.promised
    kept: dict[str, tuple[JobRecord, RunningJob]] = {}
    kept_promised: dict[str, tuple[JobRecord, RunningJob | None, float]] = {}
    out: list[RunningJob] = []
    for j in jobs:
        state = j.state
        if state not in HOLDING_OR_PROPOSED:
            continue
        job_id = j.job_id
        hit = running.get(job_id)
        if hit is not None and hit[0] is j:
            out.append(hit[1])
            kept[job_id] = hit
            continue
        # A proposed job, or one held since an unknown time, starts "now": all but the times is reused.
        again = promised.get(job_id)
        if again is not None and again[0] is j:
            kept_promised[job_id] = again
            if again[1] is not None:
                out.append(
                    RunningJob(job=again[1].job, hosts=again[1].hosts, started_at=now, planned_end=now + again[2])
                )
            continue
        r = running_job(j, index, margin, now)
        if state != "proposed" and (j.started_at or j.scheduled_at) is not None:
            if r is not None:
                kept[job_id] = (j, r)
        else:
            kept_promised[job_id] = (j, r, 0.0 if r is None else estimated_runtime(r.job, margin))
        if r is not None:
            out.append(r)
    cache.running, cache.promised = kept, kept_promised
    return out


class HeldRuns:
    """`running_jobs` of a `LiveBook`, kept by the book's changes: the core's `RunningJob` of every job
    holding or promised GPUs whose hosts are all in the view, in the book's order, and the deadlines
    of those with a time limit, so that a cycle costs the jobs that changed (and the promised ones,
    which start "now" every cycle), not a walk over every held job. Built for one book, host list
    and margin (`keeps`); `update` brings it to the book's version."""

    __slots__ = (
        "absent", "built", "deadlines", "index", "margin", "node_ids", "order", "promised", "runs", "seq_of", "token",
        "version",
    )  # fmt: skip

    def __init__(self, book: LiveBook, index: dict[str, int], node_ids: list[str], margin: float, now: float) -> None:
        self.token, self.version = book.token, book.version
        self.index, self.node_ids, self.margin = index, node_ids, margin
        self.order = Ordered()  # seq -> job id, of the jobs in `runs`
        self.runs: list[RunningJob] = []  # by position of `order`
        self.seq_of: dict[str, int] = {}
        # Job id -> (seq, its RunningJob as of the last cycle, its estimated runtime) of the jobs that
        # start "now" every cycle (proposed, or held since an unknown time).
        self.promised: dict[str, tuple[int, RunningJob, float]] = {}
        self.deadlines: list[tuple[float, int]] = []  # (started_at + time limit, seq), sorted
        self.absent: dict[str, int] = {}  # job id -> seq of the jobs with a host not in the view
        self.built = 0  # running pictures computed by the last `update` (the jobs that changed)
        records = book.records
        for job_id in book.held.ids:
            self._add(records[job_id], book.seq_of(job_id), now)

    def keeps(self, book: LiveBook, index: dict[str, int], node_ids: list[str], margin: float, now: float) -> bool:
        """Whether `update` can bring it to `book` for this host list and margin; another host list
        is taken on (`rehost`)."""
        if self.token is not book.token or self.margin != margin:
            return False
        if book.changes_since(self.token, self.version) is None:
            return False
        if self.node_ids is not node_ids:
            if self.node_ids != node_ids:
                self.rehost(book, index, node_ids, now)
            self.node_ids, self.index = node_ids, index
        return True

    def rehost(self, book: LiveBook, index: dict[str, int], node_ids: list[str], now: float) -> None:
        """Take on another host list (a node joined or left the cycle's hosts): each running picture's
        hosts mapped to their new indices, not built again from the job's record (a job with a host
        no longer in the list drops out until it is back), and the jobs that were out tried again."""
        names = self.node_ids
        order, runs, seq_of = Ordered(), [], {}
        dropped: list[tuple[str, int, RunningJob]] = []
        # Both host lists are in node id order, so a picture's hosts stay in index order.
        for seq, job_id, r in zip(self.order.seqs, self.order.ids, self.runs, strict=True):
            try:
                hosts = tuple([(index[names[h]], g) for h, g in r.hosts])
            except KeyError:
                dropped.append((job_id, seq, r))
                continue
            order.seqs.append(seq)
            order.ids.append(job_id)
            runs.append(RunningJob(job=r.job, hosts=hosts, started_at=r.started_at, planned_end=r.planned_end))
            seq_of[job_id] = seq
        self.order, self.runs, self.seq_of = order, runs, seq_of
        self.index, self.node_ids = index, node_ids
        for job_id, (seq, _, runtime) in list(self.promised.items()):
            i = order.position(seq)
            if i is not None:
                self.promised[job_id] = (seq, runs[i], runtime)
        for job_id, seq, r in dropped:
            self._forget(job_id, seq, r)
        retry, self.absent = self.absent, {job_id: seq for job_id, seq, _ in dropped}
        records = book.records
        for job_id, seq in retry.items():
            job = records.get(job_id)
            if job_id not in self.absent and job is not None and job.state in HOLDING_OR_PROPOSED:
                self._add(job, seq, now)

    def _add(self, job: JobRecord, seq: int, now: float) -> None:
        self.built += 1
        r = running_job(job, self.index, self.margin, now)
        job_id = job.job_id
        if r is None:
            self.absent[job_id] = seq
            return
        self.runs.insert(self.order.add(seq, job_id), r)
        self.seq_of[job_id] = seq
        if job.state != "proposed" and (job.started_at or job.scheduled_at) is not None:
            if r.job.time_limit_s is not None:
                insort(self.deadlines, (r.started_at + r.job.time_limit_s, seq))
        else:
            self.promised[job_id] = (seq, r, estimated_runtime(r.job, self.margin))

    def _remove(self, job_id: str) -> None:
        self.absent.pop(job_id, None)
        seq = self.seq_of.pop(job_id, None)
        if seq is None:
            return
        i = self.order.remove(seq)
        assert i is not None
        self._forget(job_id, seq, self.runs.pop(i))

    def _forget(self, job_id: str, seq: int, r: RunningJob) -> None:
        """Drop a job's promise or deadline (its picture `r` is out of `runs` already)."""
        if self.promised.pop(job_id, None) is None and r.job.time_limit_s is not None:
            deadlines = self.deadlines
            at = bisect_right(deadlines, (r.started_at + r.job.time_limit_s, seq)) - 1
            assert deadlines[at][1] == seq
            del deadlines[at]

    def update(self, book: LiveBook, now: float) -> tuple[list[RunningJob], list[str]]:
        """The running jobs at `now`, in the book's order, and the ids of those past their time limit
        (in the same order). `keeps` must hold."""
        changes = book.changes_since(self.token, self.version)
        assert changes is not None
        records = book.records
        self.built = 0
        for job_id in dict.fromkeys(changes):
            self._remove(job_id)
            job = records.get(job_id)
            if job is not None and job.state in HOLDING_OR_PROPOSED:
                self._add(job, book.seq_of(job_id), now)
        self.version = book.version
        order, runs = self.order, self.runs
        over: list[tuple[int, str]] = []
        for job_id, (seq, r, runtime) in self.promised.items():
            i = order.position(seq)
            assert i is not None
            runs[i] = r = RunningJob(job=r.job, hosts=r.hosts, started_at=now, planned_end=now + runtime)
            self.promised[job_id] = (seq, r, runtime)
            if r.job.time_limit_s is not None and now >= r.started_at + r.job.time_limit_s:
                over.append((seq, job_id))
        due = self.deadlines[: bisect_right(self.deadlines, (now, float("inf")))]
        for _, seq in due:
            i = order.position(seq)
            assert i is not None
            over.append((seq, order.ids[i]))
        over.sort()
        return runs, [job_id for _, job_id in over]


QueueRule = tuple[QueuePolicy, CycleConfig]


def host_index(node_ids: list[str], cache: PlanCache | None) -> dict[str, int]:
    """Node id -> host index; the cache's while the host list is the same object."""
    if cache is not None and cache.index is not None and cache.index[0] is node_ids:
        return cache.index[1]
    index = {n: i for i, n in enumerate(node_ids)}
    if cache is not None:
        cache.index = (node_ids, index)
    return index


def framework_placer(
    inputs: PlacementInputs,
    view: fw.ClusterView,
    node_ids: list[str],
    hints: Mapping[str, AskHints],
    now: dt.datetime,
    cache: PlanCache | None,
) -> FrameworkPlacer:
    """The cycle's `FrameworkPlacer`: the last cycle's, started anew, while its placement view, host
    list, framework and sample are the same objects (the view's free GPUs then stay as it left them)."""
    assert inputs.framework is not None
    key = (view, node_ids, inputs.framework)
    if cache is not None and (kept := cache.placer) is not None and kept.sample == inputs.sample:
        if all(a is b for a, b in zip(key, cache.placer_key, strict=True)):
            kept.start_cycle(hints, now)
            return kept
    placer = FrameworkPlacer(inputs.framework, view, node_ids, hints, now, inputs.sample)
    if cache is not None:
        cache.placer, cache.placer_key = placer, key
    return placer


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
    predictions: Mapping[str, RuntimeEstimate] | None = None,
    in_flight: dict[str, set[int]] | None = None,
) -> CyclePlan:
    """Decide one cycle over the live `jobs` on `ledger`; see the module docstring and `PlanCache`.

    `placement`: the framework and what its plugins read (default: the core's `LeafPlacer`), the
    published fabric among them (`PlacementInputs.fabric`; `leaf_label` is the fallback while none is).
    `queue_rules`: queue -> its own (policy, cycle config); other queues use `policy`/`config`.
    With several queues waiting, each is decided by its own policy in turn on what the previous
    ones left, the queue whose oldest job has waited longest first (see `cycle_by_queue`).
    `predictions`: job id -> the learned runtime of a queued job (`predictor.RuntimePredictor`).
    `in_flight`: `taken_in_flight(ledger, jobs)` when the caller keeps it (`InFlight`, `LiveJobs.in_flight`).
    """
    taken = taken_in_flight(ledger, jobs) if in_flight is None else in_flight
    # The leaf groups of the published fabric when one is in force, else the node label `leaf_label`.
    leaves = LeafSource(leaf_label, placement.fabric if placement.framework is not None else None)
    view = host_view(ledger, taken, leaves) if cache is None else host_view_cached(ledger, taken, leaves, cache)
    index = host_index(view.node_ids, cache)
    book = jobs if isinstance(jobs, LiveBook) else None
    queued: Iterable[JobRecord] = book.queued() if book is not None else (j for j in jobs if j.state == "queued")
    waiting = [j for j in queued if j.not_before is None or j.not_before <= now]
    overruns: list[str] | None = None
    if book is not None and cache is not None:
        margin = config.safety_margin
        if cache.held is None or not cache.held.keeps(book, index, view.node_ids, margin, now.timestamp()):
            cache.held = HeldRuns(book, index, view.node_ids, margin, now.timestamp())
        running, overruns = cache.held.update(book, now.timestamp())
    else:
        running = running_jobs(jobs, index, view.node_ids, config.safety_margin, now.timestamp(), cache)
    placer: Placer | None = None
    sites = NO_SITES
    if placement.framework is None:
        # Only the framework's placement keeps a job to its site's hosts, or off the node a failure
        # took it from: the leaf placer leaves those waiting (the latter until `avoid_until`).
        waiting = [j for j in waiting if not j.sites and not avoided(j, now) and j.mig_profile is None]
    elif view.node_ids:
        sites = plan_sites(ledger, view, waiting, running, placement, now.timestamp(), config.safety_margin)
        fw_view = placement_view(ledger, view, placement, cache)
        mig_capable = {
            p: mig_hosts_cached(ledger, p, cache) for p in sorted({j.mig_profile for j in waiting if j.mig_profile})
        }
        hints = {
            j.job_id: hints_of(
                j, _and(allowed_hosts(j, sites, view.node_ids, now), mig_capable.get(j.mig_profile or ""))
            )
            for j in waiting
            if j.dataset or j.gpu_model or j.milli < 1000 or j.sites or avoided(j, now) or j.mig_profile
        }
        placer = framework_placer(placement, fw_view, view.node_ids, hints, now, cache)
    groups: dict[str, list[Job]] = {}
    for j in waiting:
        groups.setdefault(j.queue, []).append(core_job(j, predictions.get(j.job_id) if predictions else None))
    rules = queue_rules or {}

    def queue(name: str, jobs: list[Job]) -> QueueRequest:
        q_policy, q_config = rules.get(name, (policy, config))
        return QueueRequest(
            name=name,
            jobs=jobs,
            policy=q_policy,
            config=msgspec.structs.replace(q_config, hosts_per_leaf=view.hosts_per_leaf),
        )

    framework = isinstance(placer, FrameworkPlacer)
    # The host view's free view, kept by the cache, lent to the first queue's cycle and given back.
    free_view = cache.layout.free_view if cache is not None and cache.layout is not None else None
    if free_view is not None:
        free_view.journal = []
    try:
        reply = plan(
            PlanRequest(
                now=now.timestamp(),
                # No job waiting: the cluster's policy on an empty queue still kills jobs past their limit.
                queues=[queue(q, jobs) for q, jobs in groups.items()] or [queue("", [])],
                running=running,
                cluster=view.cluster,
                names=view.node_ids,
                fairshare=placement.fairshare,
                placer=placer,
                sharp_limits=placement.sharp_limits if framework else None,
                sharp_held=placement.sharp_held,
                fabric_version=leaves.fabric.about.version if framework and leaves.fabric is not None else None,
                free_view=free_view,
                overruns=overruns,
            )
        )
    finally:
        if free_view is not None:
            free_view.rollback()
            free_view.journal = None
    # The records assign() reads: the starts' (all waiting jobs) and, when there are any, the victims'.
    records: Mapping[str, JobRecord]
    if reply.preemptions or reply.kills:
        records = book.records if book is not None else {j.job_id: j for j in jobs}
    else:
        records = {j.job_id: j for j in waiting}
    return CyclePlan(
        ledger_version=ledger.version,
        proposals=assign(reply, view, records, index),
        preempted=[(p.job_id, p.for_job_id) for p in reply.preemptions],
        killed=list(reply.kills),
        waiting=reply.waiting,
        order=reply.order,
        sites={job_id: (c.site, c.reason) for job_id, c in sites.chosen.items()},
    )


def assign(
    reply: PlanReply, view: HostView, jobs: Mapping[str, JobRecord], index: Mapping[str, int] | None = None
) -> list[Proposal]:
    """The exact GPUs of every start, host by host in its rank order: the lowest free indices of
    each host the core chose, counting the GPUs of the jobs this cycle preempts or kills as free
    (the core gave them to the starts)."""
    # Only the hosts a start or a victim touches are copied and sorted (a cycle touches few of 1,000).
    free: dict[int, list[int]] = {}

    def free_on(host: int) -> list[int]:
        if host not in free:
            free[host] = sorted(view.free_gpus[host])
        return free[host]

    if index is None:
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
        picked: dict[str, list[int]] = {}
        for host, count in start.hosts:
            picked[view.node_ids[host]], free[host] = free_on(host)[:count], free[host][count:]
        assignments = [
            GpuAssignment(
                node_id=node_id,
                gpu_index=g,
                milli=job.milli,
                memory_mib=job.memory_mib if fraction else None,
                mig_profile=job.mig_profile,
            )
            for node_id in start.placement.ranks
            for g in picked[node_id]
        ]
        out.append(Proposal(job_id=job.job_id, assignments=assignments, placement=start.placement))
    return out


class ProposalStamp(msgspec.Struct, frozen=True, kw_only=True):
    """What the scheduler service puts on every command of a cycle: its `source`, its scheduler
    `group`, the lease a grant gets (`lease_s`) and the leader's fencing `term`."""

    source: str
    group: str
    lease_s: float
    term: int | None = None


# Job id -> (the record the cycle read, the record it writes, the events it sends with it).
JobChanges = dict[str, tuple[JobRecord, JobRecord, list[Message]]]


def job_changes(
    plan: CyclePlan,
    live: Mapping[str, JobRecord],
    now: dt.datetime,
    config: lifecycle.LifecycleConfig,
    stamp: ProposalStamp,
    stamped: Callable[[JobRecord], JobRecord] = lambda job: job,
) -> JobChanges:
    """What `plan` does to the live jobs: victims preempted and jobs past their limit killed (their
    release events), starts proposed (a `ProposePlacement` each, NCCL settings in the workload's
    environment), waiting jobs given the typed reason of this cycle, and every site chosen this
    cycle recorded. Only records that change are in the result. `stamped`: the record as the cycle
    shows it (carrying the runtime prediction it used)."""
    changes: JobChanges = {}
    for victim_id, for_id in plan.preempted:
        t = lifecycle.preempt(live[victim_id], for_id, now, config)
        assert t.job is not None
        changes[victim_id] = (live[victim_id], t.job, t.events)
    for killed_id in plan.killed:
        t = lifecycle.kill(live[killed_id], now, config)
        assert t.job is not None
        changes[killed_id] = (live[killed_id], t.job, t.events)
    for p in plan.proposals:
        job = live[p.job_id]
        cause = f"{job.job_id}/proposed/{job.attempt}/{job.rejections}/{stamp.group}/{stamp.term}/{plan.ledger_version}"
        cmd = ProposePlacement(
            id=event_id(now, cause, 0),
            occurred_at=now,
            source=stamp.source,
            key=job.job_id,
            job_id=job.job_id,
            tenant=job.tenant,
            queue=job.queue,
            ledger_version=plan.ledger_version,
            assignments=p.assignments,
            lease_s=stamp.lease_s,
            workload=records.workload_with_env(job.workload, p.nccl_env),
            scheduler_group=stamp.group,
            fencing_term=stamp.term,
            on_member_failure=job.on_member_failure if job.hosts > 1 else "restart",
        )
        changes[job.job_id] = (
            job,
            stamped(records.proposed(job, cmd.id, p.assignments, stamp.term, p.placement)),
            [cmd],
        )
    for job_id, wait in plan.waiting.items():
        waiting = live.get(job_id)
        if waiting is not None and job_id not in changes:
            why = wait.text()
            same = waiting.reason == why and waiting.wait_code == wait.code
            again = stamped(waiting if same else msgspec.structs.replace(waiting, reason=why, wait_code=wait.code))
            if again is not waiting:
                changes[job_id] = (waiting, again, [])
    for job_id, (site, why) in plan.sites.items():  # the site chosen this cycle, placed or waiting
        old, new, commands = changes.get(job_id) or (live[job_id], live[job_id], [])
        if (new.site, new.site_reason) != (site, why):
            changes[job_id] = (old, msgspec.structs.replace(new, site=site, site_reason=why), commands)
    return changes


def leases_due(
    live: Iterable[JobRecord], allocations: Mapping[str, Allocation], now: dt.datetime, lease_s: float
) -> list[tuple[str, str]]:
    """(job id, allocation id) of every held allocation whose lease has less than half of `lease_s`
    left: the scheduler renews them (`RenewLease`, extending by `lease_s`)."""
    half = dt.timedelta(seconds=lease_s / 2)
    out = []
    for job in live:
        alloc = allocations.get(job.allocation_id or "") if job.holding else None
        if alloc is not None and alloc.lease_expires_at - now <= half:
            out.append((job.job_id, alloc.allocation_id))
    return out


class LeaseWatch:
    """`leases_due` of a `LiveBook`'s jobs, kept by the book's changes and a heap of the times each
    held allocation's lease comes due (its expiry less half of `lease_s`), so that a call costs the
    jobs that changed and the leases due, not a walk over every held job. A lease renewed since it
    went into the heap goes back in at its new time when its old one comes; one not in the ledger
    yet, or due (until its renewal lands), is looked at again at every call. The same answers as
    `leases_due(book, ...)`, in the book's order; one `lease_s` per watch."""

    def __init__(self) -> None:
        self._heap: list[tuple[dt.datetime, int, str, str]] = []  # (due at, seq, job id, allocation id)
        self._tracked: dict[str, str] = {}  # job id -> the allocation id of its entry in the heap
        self._seen: tuple[object, int] | None = None  # the book's (token, version) last read

    def due(
        self, book: LiveBook, allocations: Mapping[str, Allocation], now: dt.datetime, lease_s: float
    ) -> list[tuple[str, str]]:
        half = dt.timedelta(seconds=lease_s / 2)
        heap, tracked = self._heap, self._tracked
        changes = book.changes_since(*self._seen) if self._seen is not None else None
        if changes is None:
            heap.clear()
            tracked.clear()
        records = book.records
        for job_id in book.held.ids if changes is None else dict.fromkeys(changes):
            job = records.get(job_id)
            allocation_id = job.allocation_id if job is not None and job.holding else None
            if allocation_id is None:
                tracked.pop(job_id, None)  # its entry, if any, is dropped when it comes up
                continue
            if tracked.get(job_id) == allocation_id:
                continue
            tracked[job_id] = allocation_id
            alloc = allocations.get(allocation_id)
            at = alloc.lease_expires_at - half if alloc is not None else now
            heapq.heappush(heap, (at, book.seq_of(job_id), job_id, allocation_id))
        self._seen = (book.token, book.version)
        out: list[tuple[int, str, str]] = []
        again: list[tuple[dt.datetime, int, str, str]] = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            _, seq, job_id, allocation_id = entry
            if tracked.get(job_id) != allocation_id:
                continue  # the job ended, went back to the queue or holds another allocation
            alloc = allocations.get(allocation_id)
            if alloc is None:
                again.append((now, seq, job_id, allocation_id))
            elif alloc.lease_expires_at - now <= half:
                out.append((seq, job_id, allocation_id))
                again.append(entry)
            else:
                heapq.heappush(heap, (alloc.lease_expires_at - half, seq, job_id, allocation_id))
        for entry in again:
            heapq.heappush(heap, entry)
        out.sort()
        return [(job_id, allocation_id) for _, job_id, allocation_id in out]
