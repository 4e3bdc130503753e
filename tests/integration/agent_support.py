"""Running node agents for tests: in-process (a Service on the test's bus and store) or as a process."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ibpool_node_agent.backends import GpuBackend
from ibpool_node_agent.bootstrap import bootstrap
from ibpool_node_agent.config import NodeAgentConfig
from ibpool_proto import new_id
from ibpool_proto.pool import AllocationGranted, Enforcement, GpuAssignment, WorkloadSpec
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit, Service
from ibpool_runtime.store import Store


def unique_prefix() -> str:
    return f"t{uuid.uuid4().hex[:6]}"


# Simulated GPUs that report no random ECC errors or XIDs: for tests that run the failover controller
# and count its verdicts (a random fault would cordon a GPU the test needs).
QUIET_GPUS: dict[str, object] = {"sim_ecc_rate": 0.0, "sim_xid_rate": 0.0}
QUIET_GPUS_ENV = {f"IBPOOL_NODE_AGENT_{k.upper()}": str(v) for k, v in QUIET_GPUS.items()}


@asynccontextmanager
async def running_agent(
    bus: Bus, store: Store, backends: list[GpuBackend] | None = None, **overrides: object
) -> AsyncIterator[Service[NodeAgentConfig]]:
    cfg = NodeAgentConfig(
        **{
            "nodes": 2,
            "node_prefix": unique_prefix(),
            "backend": "simulated",
            "heartbeat_interval_s": 0.2,
            "telemetry_interval_s": 0.5,
            "instance": "test",
            **overrides,
        }
    )
    kit = Kit(name="node_agent", config=cfg, bus=bus, store=store, metrics=ServiceMetrics("node_agent"))
    service = Service(kit, await bootstrap(kit, backends=backends))
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


def grant(
    node_id: str,
    gpus: list[int],
    *,
    runtime_s: float = 0.5,
    memory_mib: int | None = None,
    limit_mib: int | None = None,
    enforcement: Enforcement | None = None,
) -> AllocationGranted:
    job = f"job-{uuid.uuid4().hex[:8]}"
    return AllocationGranted(
        source="test",
        key=node_id,
        allocation_id=new_id(),
        job_id=job,
        node_id=node_id,
        kind="whole",
        assignments=[GpuAssignment(node_id=node_id, gpu_index=g) for g in gpus],
        enforcement=enforcement
        or Enforcement(env={"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}, memory_limit_mib=limit_mib),
        lease_expires_at=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5),
        ledger_version=1,
        workload=WorkloadSpec(simulated_runtime_s=runtime_s, simulated_memory_mib=memory_mib),
    )


def agent_process(
    stack: StackInfo, schema_prefix: str, *, faults: str = "", extra_env: dict[str, str] | None = None, nodes: int = 1
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "IBPOOL_NATS_URL": stack.nats_url,
        "IBPOOL_POSTGRES_DSN": stack.postgres_dsn,
        "IBPOOL_NODE_AGENT_BACKEND": "simulated",
        "IBPOOL_NODE_AGENT_NODE_PREFIX": schema_prefix,
        "IBPOOL_NODE_AGENT_NODES": str(nodes),
        "IBPOOL_NODE_AGENT_INSTANCE": schema_prefix,
        "IBPOOL_NODE_AGENT_HEARTBEAT_INTERVAL_S": "0.2",
        "IBPOOL_FAULTS": faults,
        **(extra_env or {}),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "ibpool_node_agent"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
