"""The packing view (`packing.PackingCluster`) of ledger nodes, as the packing policies and the
fragmentation measure see them.

One packing node per ledger node and per group of its usable GPUs of one model and memory size (a
packing node has one GPU model), in the order the node ids are given. Each packing node has the
ledger node's CPU and memory with what is granted taken, and every GPU its granted compute,
memory and MIG layout taken. `leaf` names each node's fabric leaf (packing's `NodeSpec.leaf`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .ledger import WHOLE, Gpu, Ledger, Node
from .packing import NodeSpec, PackingCluster, PackingError, PackRequest

Members = list[tuple[Node, list[Gpu]]]
"""Per packing node: its ledger node and its GPUs, in packing GPU index order."""


def pack_ledger(
    view: Ledger,
    node_ids: Iterable[str],
    usable: Callable[[Gpu], bool],
    *,
    cpu_milli: int = 0,
    memory_mib: int = 0,
    leaf: Callable[[str], str] | None = None,
) -> tuple[PackingCluster, Members] | None:
    """The packing view of the nodes `node_ids` with `cpu_milli` and `memory_mib` free, over their
    GPUs that are `usable`; None when no GPU is left or the ledger holds what packing cannot show."""
    specs: list[NodeSpec] = []
    members: Members = []
    for node_id in node_ids:
        node = view.nodes[node_id]
        if node.free_cpu_milli < cpu_milli or node.free_memory_mib < memory_mib:
            continue
        groups: dict[tuple[str, int], list[Gpu]] = {}
        for g in node.gpus:
            if usable(g):
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
                    leaf=leaf(node_id) if leaf is not None else "",
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
