"""What the pool allocator's integration tests share: unique names and the nodes they register."""

from __future__ import annotations

import uuid

from ibpool_proto.node import GpuInfo, NodeRegistered

MODEL = "H100-80GB"


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def registered(node_id: str, gpus: int = 4) -> NodeRegistered:
    return NodeRegistered(
        source="test",
        key=node_id,
        node_id=node_id,
        hostname=node_id,
        cpu_milli=64_000,
        memory_mib=512_000,
        gpus=[GpuInfo(index=i, uuid=f"GPU-{node_id}-{i}", model=MODEL, memory_mib=81_920) for i in range(gpus)],
        backend="test",
    )
