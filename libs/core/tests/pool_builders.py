"""Ledgers and commands for the pool tests, built the same way in every test file."""

from __future__ import annotations

import datetime as dt

import msgspec

from ibpool_core.pool import allocate as al
from ibpool_core.pool.ledger import Ledger
from ibpool_core.pool.messages import ProposePlacement, RequestAllocation, SetQuota
from ibpool_core.pool.quotas import Quota
from ibpool_proto.node import GpuInfo, NodeRegistered
from ibpool_proto.pool import GpuAssignment, ResourceRequest

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
H100 = "NVIDIA H100 80GB HBM3"
H100_MIB = 81559
L40S = "NVIDIA L40S"


def hops(a: str, b: str) -> int | None:
    """Fabric distance: every node under one leaf (2 hops) but "far" (6, over the limit of 4) and "x" (no path)."""
    if "x" in (a, b):
        return None
    if a == b:
        return 0
    return 6 if "far" in (a, b) else 2


def node(node_id: str, gpus: int = 2, model: str = H100, memory: int = H100_MIB, uuid_tag: str = "") -> NodeRegistered:
    return NodeRegistered(
        source="agent",
        key=node_id,
        node_id=node_id,
        hostname=f"{node_id}.example",
        cpu_milli=64_000,
        memory_mib=512_000,
        backend="simulated",
        gpus=[
            GpuInfo(
                index=i,
                uuid=f"GPU-{node_id}-{i}{uuid_tag}",
                model=model,
                memory_mib=memory,
                mig_capable=model != L40S,
            )
            for i in range(gpus)
        ],
        api_url=f"http://{node_id}.example:9400",
    )


def a(node_id: str, gpu: int, milli: int = 1000, memory: int | None = None, mig: str | None = None) -> GpuAssignment:
    return GpuAssignment(node_id=node_id, gpu_index=gpu, milli=milli, memory_mib=memory, mig_profile=mig)


def propose(
    job: str,
    *assignments: GpuAssignment,
    version: int = 2,
    tenant: str = "t1",
    queue: str = "q1",
    lease_s: float = 300.0,
    client: str | None = None,
    cpu: int = 0,
    cmd_id: str | None = None,
) -> ProposePlacement:
    return ProposePlacement(
        id=cmd_id or f"cmd-{job}",
        source="scheduler",
        key=job,
        job_id=job,
        tenant=tenant,
        queue=queue,
        ledger_version=version,
        assignments=list(assignments),
        lease_s=lease_s,
        client_node_id=client,
        cpu_milli=cpu,
    )


def request(
    job: str,
    kind: str = "whole",
    *,
    tenant: str = "t1",
    queue: str = "q1",
    client: str | None = None,
    cmd_id: str | None = None,
    **resources: object,
) -> RequestAllocation:
    return RequestAllocation(
        id=cmd_id or f"cmd-{job}",
        source="scheduler",
        key=job,
        job_id=job,
        tenant=tenant,
        queue=queue,
        request=msgspec.convert({"kind": kind, **resources}, ResourceRequest),
        client_node_id=client,
    )


def quota(name: str, milli: int, memory: int = 10**9, scope: str = "tenant", **kw: object) -> SetQuota:
    q = msgspec.convert(
        {"scope": scope, "name": name, "gpu_model": H100, "nominal": {"milli": milli, "memory_mib": memory}, **kw},
        Quota,
    )
    return SetQuota(id=f"quota-{scope}-{name}-{milli}", source="api", key=name, quota=q)


def health(cls: type, node_id: str, **kw: object) -> al.Input:
    out: al.Input = cls(source="failover", key=node_id, node_id=node_id, **kw)
    return out


def pool(*inputs: al.Input, config: al.AllocatorConfig = al.DEFAULT_CONFIG) -> Ledger:
    ledger = Ledger()
    for cmd in inputs:
        al.handle(ledger, cmd, T0, hops=hops, config=config)
    return ledger
