"""A `GpuPlacer` that places with a packing policy (`policies.POLICIES`) instead of plain first fit.

`policy_placer(name, fabric)` returns a placer that builds the packing view
(`ledger_packing.pack_ledger`) of the candidate nodes, asks the named policy to choose and answers
with the exact GPUs it chose:

* whole, fraction, MIG: the best-scored node and option (`packing.choose`);
* gang (N hosts x G whole GPUs): the scheduler's own placement, the plugin framework with
  `SCHEDULER_PROFILE` on the fabric's `FabricIndex` (`fabric`, a `ibpool_core.fabric.view.FabricView`):
  the lowest tier that holds it, the tightest group there, the fewest leaf groups, hosts in rank
  order; a candidate the fabric does not have never joins a gang. While no fabric is known for the
  candidates (none yet, or one that names none of them), first fit;
* remote (whole GPUs or one fraction for a client on another node; the allocator has kept the
  candidates within `max_remote_hops`): the nearest candidates first, by `fabric.hops` from the
  client, and the policy's choice among the nodes at that distance; without distances, all
  candidates at once.

The view: one packing node per candidate node (in `want.nodes` order, so ties go to the first
candidate, as in first fit) and per group of its usable GPUs of one model and memory size. Usable
GPUs are the ready ones of a model the request allows (for MIG, only MIG-capable ones). Nodes
without the CPU and memory the request needs on the host are left out.

The answer of the policy is checked against the ledger; when it does not fit there (the view
cannot show an odd GPU, e.g. memory granted without compute; a gang given two packing nodes of one
host with two GPU models) or the policy finds nothing, first fit is asked (for remote use, on the
same distance group).

Every placer keeps its own policy instance, so fgd and fgd+ learn their workload mix
(`fragmentation.WorkloadMix`) online from the requests that placer sees (a request is observed
once, on its first placement attempt, not again when the allocator retries without a model). A
policy that learns no mix gets one kept beside it, so `fragmentation` can measure the pool against
what was asked of any policy.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Protocol

import msgspec

from ibpool_proto.pool import GpuAssignment, ResourceRequest

from ..fabric.view import FabricState
from ..sched import framework as fw
from ..sched.profiles import SCHEDULER_PROFILE
from . import mig
from .fragmentation import WorkloadMix
from .ledger import WHOLE, Gpu, Ledger, Node
from .ledger_packing import Members, pack_ledger
from .packing import PackingCluster, PackingError, PackRequest, ScorePlugin, choose
from .placement import PlacementRequest, first_fit
from .policies import make_policy
from .pool_fragmentation import PoolFragmentation, measure_fragmentation

_COVERED = ("whole", "fraction", "mig")
# Gang placement has no Permit plugin that waits, so the framework's clock is never read.
_NO_TIME = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class FabricLookup(Protocol):
    """What the placer asks of the fabric (`ibpool_core.fabric.view.FabricView` answers all)."""

    @property
    def state(self) -> FabricState | None:
        """The fabric in force (its index), None while none is known."""
        ...

    def leaf_group(self, node_id: str) -> str | None:
        """The leaf group of the node, None when unknown."""
        ...

    def hops(self, a: str, b: str) -> int | None:
        """Links between two nodes; None, KeyError or another LookupError when unknown."""
        ...


class PolicyPlacer:
    """A `GpuPlacer` (see the module docstring); `fragmentation(ledger)` measures the pool against the
    workload mix this placer has seen."""

    def __init__(self, name: str, fabric: FabricLookup | None = None) -> None:
        self.policy: ScorePlugin = make_policy(name)
        self.fabric = fabric
        self.__name__ = f"policy_placer[{name}]"
        self._framework: fw.Framework | None = None
        own = getattr(self.policy, "mix", None)
        # The mix fgd and fgd+ learn; the other policies learn none, so one is kept beside them.
        self.mix: WorkloadMix = own if isinstance(own, WorkloadMix) else WorkloadMix()
        self._mix_is_policys = own is self.mix
        self._measured: tuple[tuple[int, int], PoolFragmentation] | None = None

    def __call__(self, view: Ledger, want: PlacementRequest) -> list[GpuAssignment] | None:
        r = want.request
        if r.kind == "gang":
            return self._gang(view, want)
        if r.kind == "remote":
            return self._remote(view, want)
        if r.kind not in _COVERED:
            return first_fit(view, want)
        return self._single(view, want, observe=not want.excluded_models)

    def fragmentation(self, ledger: Ledger) -> PoolFragmentation:
        """`pool_fragmentation.measure_fragmentation` of `ledger` for the mix seen so far (cached
        until the ledger or the mix changes)."""
        key = (ledger.version, self.mix.version)
        if self._measured is None or self._measured[0] != key:
            self._measured = (key, measure_fragmentation(ledger, self.mix.types()))
        return self._measured[1]

    def _observe(self, request: PackRequest) -> None:
        self.policy.observe(request)
        if not self._mix_is_policys:
            self.mix.observe(request)

    def _single(self, view: Ledger, want: PlacementRequest, *, observe: bool) -> list[GpuAssignment] | None:
        """Whole GPUs, a fraction or a MIG instance on one node."""
        r = want.request
        try:
            request = _pack_request(want)
        except PackingError:
            return first_fit(view, want)
        if observe:
            self._observe(request)
        built = _build(view, want)
        if built is None:
            return first_fit(view, want)
        cluster, members = built
        picked = choose(cluster, self.policy, request)
        if picked is None:
            return first_fit(view, want)
        n, option = picked
        placement = cluster.allocate(n, request, option)
        node, gpus = members[n]
        answer = [_assignment(node, gpus[i], r) for i in placement.gpus]
        if not all(_fits(node, gpus[i], a, want) for i, a in zip(placement.gpus, answer, strict=True)):
            return first_fit(view, want)
        return answer

    def _gang(self, view: Ledger, want: PlacementRequest) -> list[GpuAssignment] | None:
        """N hosts x G whole GPUs by the scheduler's own placement (the plugin framework with
        `SCHEDULER_PROFILE` on the fabric's `FabricIndex`: the tightest tier, fewest leaf groups, rank
        order); first fit while no fabric is known. A candidate the fabric does not have is a group
        of its own (never a gang member)."""
        if not want.excluded_models:  # the workload mix learns every shape asked of the pool
            try:
                self._observe(_pack_request(want))
            except PackingError:
                pass
        state = self.fabric.state if self.fabric is not None else None
        if state is None or not any(n in state.leaf_of for n in want.nodes):
            return first_fit(view, want)  # no fabric known for the candidates (none yet, or it names none)
        r = want.request
        free: dict[str, list[Gpu]] = {}
        hosts: list[fw.HostState] = []
        for node_id in want.nodes:
            node = view.nodes[node_id]
            if node.free_cpu_milli < want.cpu_milli or node.free_memory_mib < want.host_memory_mib:
                continue
            usable = [g for g in node.gpus if _usable(g, want) and g.fits_whole()]
            if len(usable) < r.gpus_per_host:
                continue
            free[node_id] = usable
            hosts.append(fw.HostState(name=node_id, gpu_model="", total_gpus=len(node.gpus), free_gpus=len(usable)))
        if len(hosts) < r.hosts:
            return None
        if self._framework is None:
            self._framework = fw.Framework(fw.build_profile(SCHEDULER_PROFILE))
        cluster = fw.ClusterView(state.index, hosts, off_fabric=True)
        ask = fw.PlacementAsk(job_id="gang", gpus_per_host=r.gpus_per_host, hosts=r.hosts)
        result = self._framework.place(ask, cluster, _NO_TIME)
        if result.status != "admitted":
            return None
        answer: list[GpuAssignment] = []
        for node_id in result.hosts:  # rank order: the allocator keeps it in the grants
            node = view.nodes[node_id]
            answer += [_assignment(node, g, r) for g in free[node_id][: r.gpus_per_host]]
        return answer

    def _remote(self, view: Ledger, want: PlacementRequest) -> list[GpuAssignment] | None:
        observe = not want.excluded_models
        for group in _by_distance(want, self.fabric):
            near = msgspec.structs.replace(want, nodes=group)
            found = self._single(view, near, observe=observe)
            if found is not None:
                return found
            observe = False
        return None


def policy_placer(name: str, fabric: FabricLookup | None = None) -> PolicyPlacer:
    """A placer using the packing policy `name` (and `fabric` for gangs and remote use);
    ValueError (naming the known ones) when the name is unknown."""
    return PolicyPlacer(name, fabric)


def _by_distance(want: PlacementRequest, fabric: FabricLookup | None) -> list[tuple[str, ...]]:
    """The candidates grouped by hops from the client, nearest first (unknown distances last, in
    one group); every candidate in one group without a client or a fabric."""
    client = want.client_node_id
    if client is None or fabric is None:
        return [want.nodes]
    groups: dict[float, list[str]] = {}
    for node_id in want.nodes:
        try:
            d = fabric.hops(client, node_id)
        except LookupError:
            d = None
        groups.setdefault(float("inf") if d is None else d, []).append(node_id)
    return [tuple(groups[d]) for d in sorted(groups)]


def _pack_request(want: PlacementRequest) -> PackRequest:
    r = want.request
    models = frozenset({r.gpu_model}) if r.gpu_model is not None else frozenset[str]()
    if r.kind == "mig" or r.mig_profile is not None:
        return PackRequest.mig_instance(
            r.mig_profile or "", cpu_milli=want.cpu_milli, memory_mib=want.host_memory_mib, gpu_models=models
        )
    if r.milli < WHOLE:
        return PackRequest(
            cpu_milli=want.cpu_milli,
            memory_mib=want.host_memory_mib,
            num_gpu=1,
            gpu_milli=r.milli,
            gpu_memory_mib=r.memory_mib or 0,
            gpu_models=models,
        )
    return PackRequest(
        cpu_milli=want.cpu_milli, memory_mib=want.host_memory_mib, num_gpu=r.gpus_per_host, gpu_models=models
    )


def _usable(g: Gpu, want: PlacementRequest) -> bool:
    r = want.request
    if not g.ready or not want.allows(g.model):
        return False
    if r.mig_profile is not None:
        return g.mig_capable
    if r.milli < WHOLE:
        # A fraction's memory, when not given, is its share of this GPU's memory; a GPU where that
        # does not fit but the compute does is left out (the view cannot tell them apart).
        memory = _fraction_memory(g, r)
        return g.fits_share(r.milli, memory) or g.free_milli < r.milli or bool(g.mig)
    return True


def _fraction_memory(g: Gpu, r: ResourceRequest) -> int:
    return r.memory_mib if r.memory_mib is not None else g.memory_mib * r.milli // WHOLE


def _build(
    view: Ledger, want: PlacementRequest, leaf: Callable[[str], str] | None = None
) -> tuple[PackingCluster, Members] | None:
    """The packing view of the candidates, and per packing node its ledger node and GPUs in view order."""
    return pack_ledger(
        view,
        want.nodes,
        lambda g: _usable(g, want),
        cpu_milli=want.cpu_milli,
        memory_mib=want.host_memory_mib,
        leaf=leaf,
    )


def _assignment(node: Node, g: Gpu, r: ResourceRequest) -> GpuAssignment:
    if r.mig_profile is not None:
        p = mig.profile_of(g.model, r.mig_profile)
        return GpuAssignment(
            node_id=node.node_id, gpu_index=g.index, milli=p.milli, memory_mib=p.memory_mib, mig_profile=p.name
        )
    if r.milli < WHOLE:
        return GpuAssignment(node_id=node.node_id, gpu_index=g.index, milli=r.milli, memory_mib=_fraction_memory(g, r))
    return GpuAssignment(node_id=node.node_id, gpu_index=g.index, milli=WHOLE, memory_mib=g.memory_mib)


def _fits(node: Node, g: Gpu, a: GpuAssignment, want: PlacementRequest) -> bool:
    """The assignment fits the ledger as first fit would check it."""
    if node.free_cpu_milli < want.cpu_milli or node.free_memory_mib < want.host_memory_mib:
        return False
    if not g.ready or not want.allows(g.model):
        return False
    if a.mig_profile is not None:
        return g.mig_start(a.mig_profile) is not None
    if a.milli < WHOLE:
        return g.fits_share(a.milli, a.memory_mib or 0)
    return g.fits_whole()
