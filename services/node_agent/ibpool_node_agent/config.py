"""Node agent configuration (env `IBPOOL_NODE_AGENT_<FIELD>` or a TOML file)."""

from __future__ import annotations

from typing import Literal

from ibpool_runtime.config import BaseConfig, Positive


class NodeAgentConfig(BaseConfig, frozen=True, kw_only=True):
    # How many nodes this process hosts (simulated backend only; NVML hosts its own node).
    nodes: int = 1
    # "{hostname}" in it becomes the host's name (e.g. "{hostname}-gpu" for replicas of one container spec).
    node_prefix: str = "node"
    first_node: int = 1
    backend: Literal["auto", "simulated", "nvml"] = "auto"
    gpus_per_node: int = 8
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    cpu_milli: int = 128_000
    memory_mib: int = 2_097_152
    seed: int = 42
    heartbeat_interval_s: float = 1.0
    # Past this many hosted nodes (a simulated agent standing for many hosts), the allocation
    # consumer filters by kind only and skips other agents' nodes: a consumer with four filters per
    # node takes nats-server seconds to create at thousands of nodes.
    max_node_filters: int = 256
    telemetry_interval_s: float = 5.0
    # How long a simulated workload runs when the grant does not say.
    default_runtime_s: float = 60.0
    # Simulated fault rates per telemetry sample (0 turns them off).
    sim_ecc_rate: float = 2e-4
    sim_xid_rate: float = 2e-5
    # Accept `POST /v1/nodes/{node}/gpus/{index}/xid` (simulated backend only): an operator's fault
    # drill that makes a simulated GPU report an XID in the next telemetry sample, sent at once.
    fault_injection: bool = False
    # Report this host's InfiniBand ports (sysfs) for the fabric monitor: auto = on NVML hosts that have them.
    hca_ports: Literal["auto", "sysfs", "off"] = "auto"
    # Run grants' commands as processes (the process launcher); off: such grants are refused.
    allow_commands: bool = False
    # Where processes run, one directory per allocation (empty: <tmp>/ibpool-node-agent/<source>).
    work_dir: str = ""
    # SIGTERM, then SIGKILL after this long, when an allocation is taken back.
    stop_grace_s: float = 10.0
    # Exited workloads are kept this long, then deleted (GET /v1/agent's exits by reason count those
    # kept). A grant that comes again is caught by the inbox (31 days) either way.
    workload_retention_s: Positive = 7 * 86_400.0
    # Telemetry samples kept through a bus outage (oldest dropped first when full).
    telemetry_buffer: int = 10_000
    # Where /sys is (tests point it at a fake tree).
    sysfs_root: str = "/"
    # The pool allocator's public keys (nkeys `U...`, `ibpool_runtime.grant_signing`): every grant,
    # revocation, release and expiry must be signed by one of them, else it is dead-lettered and never
    # acted on. Empty: they are not checked (development only; said at start).
    grant_signers: list[str] = []
    # Labels announced with every hosted node (TOML `[node_agent.labels]`), e.g. the scheduler's
    # `ibpool.io/leaf` (the node's leaf switch) and `ibpool.io/sharp = "true"` (a SHARP-capable leaf).
    labels: dict[str, str] = {}
