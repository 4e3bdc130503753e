"""The environment a granted workload runs with. Pure.

Three sources, later ones winning on a name they share:

1. the workload's own environment (`WorkloadSpec.env`): what the scheduler asks for every member,
   e.g. NCCL's CollNet/SHARP settings when the gang is placed under a SHARP-capable subtree, plus
   what the job set itself; `MASTER_PORT` defaults to 29500 (torchrun's) when it sets none;
2. the rank variables, from the allocation's nodes in rank order (`AllocationGranted.nodes`; a
   grant without them is a one-node allocation):
     IBPOOL_RANK / NODE_RANK        this node's position in that order (0-based)
     IBPOOL_WORLD_SIZE / NNODES     how many nodes the allocation has
     IBPOOL_HOSTS                   the nodes in rank order, comma-separated
     MASTER_ADDR                    the first of them (rank 0), the rendezvous host
   `NODE_RANK`, `NNODES` and `MASTER_ADDR` are what torchrun reads; they count hosts, not GPU
   processes (torchrun starts one process per local GPU and derives the global rank itself).
   Node ids are host names on real hosts (the NVML backend names its node after the host);
3. the grant's enforcement (device visibility, MPS and HAMi-core limits): a workload cannot widen
   what it was granted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ibpool_proto.pool import AllocationGranted

DEFAULT_MASTER_PORT = "29500"
RANK_VARIABLES = ("IBPOOL_RANK", "IBPOOL_WORLD_SIZE", "IBPOOL_HOSTS", "NODE_RANK", "NNODES", "MASTER_ADDR")


class RankError(ValueError):
    """The grant's node list does not give this node one rank; the message says how."""


def rank_env(node_id: str, nodes: Sequence[str]) -> dict[str, str]:
    """The rank variables of `node_id` in an allocation of `nodes` (rank order; empty: `node_id`
    alone). RankError when `node_id` is not among them or a node is named twice."""
    hosts = list(nodes) or [node_id]
    if len(set(hosts)) != len(hosts):
        twice = sorted({h for h in hosts if hosts.count(h) > 1})
        raise RankError(f"the allocation's nodes name {', '.join(twice)} more than once")
    if node_id not in hosts:
        raise RankError(f"node {node_id} is not among the allocation's nodes ({', '.join(hosts)})")
    rank, size = str(hosts.index(node_id)), str(len(hosts))
    return {
        "IBPOOL_RANK": rank,
        "IBPOOL_WORLD_SIZE": size,
        "IBPOOL_HOSTS": ",".join(hosts),
        "NODE_RANK": rank,
        "NNODES": size,
        "MASTER_ADDR": hosts[0],
    }


def workload_env(grant: AllocationGranted, enforced: Mapping[str, str]) -> dict[str, str]:
    """The environment of `grant`'s workload on its node, `enforced` being what the node's enforcer
    put in force for it (see the module docstring for the order). RankError as `rank_env`."""
    own = grant.workload.env if grant.workload is not None else {}
    return {"MASTER_PORT": DEFAULT_MASTER_PORT, **own, **rank_env(grant.node_id, grant.nodes), **enforced}
