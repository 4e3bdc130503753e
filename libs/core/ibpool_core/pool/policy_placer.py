"""A `Placer` that places with a packing policy (`policies.POLICIES`) instead of plain first fit.

`policy_placer(name)` returns a placer that, for a whole, fraction or MIG request, builds the
packing view (`packing.PackingCluster`) of the candidate nodes from the ledger, asks the named
policy to choose (`packing.choose`) and answers with the exact GPUs it chose.

The view: one packing node per candidate node (in `want.nodes` order, so ties go to the first
candidate, as in first fit) and per group of its usable GPUs of one model and memory size (a
packing node has one GPU model). Usable GPUs are the ready ones of a model the request allows
(for MIG, only MIG-capable ones). Each packing node has the ledger node's CPU and memory, with
what is granted taken, and every GPU its granted compute, memory and MIG layout taken. Nodes
without the CPU and memory the request needs on the host are left out.

Not covered, placed by `placement.first_fit` instead: gang and remote requests. The answer of the
policy is checked against the ledger; when it does not fit there (the view cannot show an odd
GPU, e.g. memory granted without compute) or the policy finds nothing, first fit is asked.

Every placer keeps its own policy instance, so fgd and fgd+ learn their workload mix
(`fragmentation.WorkloadMix`) online from the requests that placer sees (a request is observed
once, on its first placement attempt, not again when the allocator retries without a model).
"""

from __future__ import annotations

from ibpool_proto.pool import GpuAssignment, ResourceRequest

from . import mig
from .ledger import WHOLE, Gpu, Ledger, Node
from .packing import NodeSpec, PackingCluster, PackingError, PackRequest, choose
from .placement import PlacementRequest, Placer, first_fit
from .policies import make_policy

_COVERED = ("whole", "fraction", "mig")


def policy_placer(name: str) -> Placer:
    """A placer using the packing policy `name`; ValueError (naming the known ones) when unknown."""
    policy = make_policy(name)

    def place(view: Ledger, want: PlacementRequest) -> list[GpuAssignment] | None:
        r = want.request
        if r.kind not in _COVERED:
            return first_fit(view, want)
        try:
            request = _pack_request(want)
        except PackingError:
            return first_fit(view, want)
        if not want.excluded_models:
            policy.observe(request)
        built = _build(view, want, request)
        if built is None:
            return first_fit(view, want)
        cluster, members = built
        picked = choose(cluster, policy, request)
        if picked is None:
            return first_fit(view, want)
        n, option = picked
        placement = cluster.allocate(n, request, option)
        node, gpus = members[n]
        answer = [_assignment(node, gpus[i], r) for i in placement.gpus]
        if not all(_fits(node, gpus[i], a, want) for i, a in zip(placement.gpus, answer, strict=True)):
            return first_fit(view, want)
        return answer

    place.__name__ = f"policy_placer[{name}]"
    return place


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
    return PackRequest(cpu_milli=want.cpu_milli, memory_mib=want.host_memory_mib, num_gpu=r.gpus, gpu_models=models)


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
    view: Ledger, want: PlacementRequest, request: PackRequest
) -> tuple[PackingCluster, list[tuple[Node, list[Gpu]]]] | None:
    """The packing view of the candidates, and per packing node its ledger node and GPUs in view order."""
    specs: list[NodeSpec] = []
    members: list[tuple[Node, list[Gpu]]] = []
    for node_id in want.nodes:
        node = view.nodes[node_id]
        if node.free_cpu_milli < want.cpu_milli or node.free_memory_mib < want.host_memory_mib:
            continue
        groups: dict[tuple[str, int], list[Gpu]] = {}
        for g in node.gpus:
            if _usable(g, want):
                groups.setdefault((g.model, g.memory_mib), []).append(g)
        for (model, memory), gpus in groups.items():
            specs.append(
                NodeSpec(
                    name=f"{node_id}/{model}/{memory}",
                    cpu_milli=node.cpu_milli,
                    memory_mib=node.memory_mib,
                    gpu_model=model,
                    gpus=len(gpus),
                    gpu_memory_mib=memory,
                )
            )
            members.append((node, gpus))
    if not specs:
        return None
    layouts = {(n, i): g.mig for n, (_, gpus) in enumerate(members) for i, g in enumerate(gpus) if g.mig}
    try:
        cluster = PackingCluster(specs, layouts)
        for n, (node, gpus) in enumerate(members):
            used = PackRequest(
                cpu_milli=min(node.granted_cpu_milli, node.cpu_milli),
                memory_mib=min(node.granted_memory_mib, node.memory_mib),
            )
            cluster.allocate_gpus(n, used, ())
            for i, g in enumerate(gpus):
                if g.mig or g.granted_milli <= 0:
                    continue
                if g.granted_milli >= WHOLE:
                    cluster.allocate_gpus(n, PackRequest(num_gpu=1), (i,))
                else:
                    share = PackRequest(
                        num_gpu=1,
                        gpu_milli=g.granted_milli,
                        gpu_memory_mib=max(0, min(g.granted_memory_mib, g.memory_mib)),
                    )
                    cluster.allocate_gpus(n, share, (i,))
    except PackingError:
        return None
    return cluster, members


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
