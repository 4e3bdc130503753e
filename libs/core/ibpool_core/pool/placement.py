"""The placer plug-in point of RequestAllocation, and its default: first fit.

When a request comes without an exact assignment, the allocator filters the nodes (ready, with a
GPU of an allowed model, within the hop limit for remote use) and asks a `GpuPlacer` to choose the
GPUs. Packing policies plug in here.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from ibpool_proto.pool import GpuAssignment, ResourceRequest

from . import mig
from .ledger import WHOLE, Gpu, Ledger, Node


class PlacementRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What to place and where it may go.

    nodes             the candidate node ids, in the ledger's order: each exists and is ready
    excluded_models   GPU models the allocator took out (the tenant's or queue's quota is spent there)
    cpu_milli, host_memory_mib   host CPU and memory needed on every node used
    """

    request: ResourceRequest
    nodes: tuple[str, ...]
    excluded_models: tuple[str, ...] = ()
    cpu_milli: int = 0
    host_memory_mib: int = 0
    client_node_id: str | None = None

    def allows(self, model: str) -> bool:
        wanted = self.request.gpu_model
        return (wanted is None or wanted == model) and model not in self.excluded_models


class GpuPlacer(Protocol):
    def __call__(self, view: Ledger, want: PlacementRequest) -> list[GpuAssignment] | None:
        """Choose the exact GPUs for `want.request` on the nodes `want.nodes`, or None when nothing fits.

        May assume: every node of `want.nodes` exists in `view` and is ready.
        Must: use only ready GPUs of models `want.allows`, on nodes with `want.cpu_milli` and
        `want.host_memory_mib` free; give every assignment its milli (1000 for whole GPUs, the
        request's for a fraction, the profile's for MIG) and, for a fraction, its memory; for a
        gang, `hosts` nodes with `gpus` GPUs each; leave the MIG start to the allocator.
        Must not: change `view` or anything in it.
        The allocator checks the answer as it checks a proposal and rejects a placement that does
        not fit rather than commit it.
        """
        ...


def first_fit(view: Ledger, want: PlacementRequest) -> list[GpuAssignment] | None:
    """The first candidate node, in ledger order, and the lowest GPU indices there that fit."""
    r = want.request
    found: list[GpuAssignment] = []
    for node_id in want.nodes:
        node = view.nodes[node_id]
        if node.free_cpu_milli < want.cpu_milli or node.free_memory_mib < want.host_memory_mib:
            continue
        gpus = [g for g in node.gpus if g.ready and want.allows(g.model)]
        if r.kind == "gang":
            whole = _whole(node, gpus, r.gpus_per_host)
            if whole:
                found += whole
                if len(found) == r.gpus_per_host * r.hosts:
                    return found
            continue
        here = _on_node(node, gpus, r)
        if here:
            return here
    return None


def _whole(node: Node, gpus: list[Gpu], count: int) -> list[GpuAssignment]:
    free = [g for g in gpus if g.fits_whole()][:count]
    if len(free) < count:
        return []
    return [GpuAssignment(node_id=node.node_id, gpu_index=g.index, milli=WHOLE, memory_mib=g.memory_mib) for g in free]


def _on_node(node: Node, gpus: list[Gpu], r: ResourceRequest) -> list[GpuAssignment]:
    if r.mig_profile is not None:
        for g in gpus:
            if g.mig_start(r.mig_profile) is not None:
                p = mig.profile_of(g.model, r.mig_profile)
                return [
                    GpuAssignment(
                        node_id=node.node_id,
                        gpu_index=g.index,
                        milli=p.milli,
                        memory_mib=p.memory_mib,
                        mig_profile=p.name,
                    )
                ]
        return []
    if r.milli < WHOLE:
        for g in gpus:
            memory = r.memory_mib if r.memory_mib is not None else g.memory_mib * r.milli // WHOLE
            if g.fits_share(r.milli, memory):
                return [GpuAssignment(node_id=node.node_id, gpu_index=g.index, milli=r.milli, memory_mib=memory)]
        return []
    return _whole(node, gpus, r.gpus_per_host)
