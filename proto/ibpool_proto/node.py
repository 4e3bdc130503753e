"""Node domain: what node agents say about their hosts and GPUs."""

from __future__ import annotations

from typing import ClassVar

import msgspec

from .message import Event


class GpuInfo(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    uuid: str
    model: str
    memory_mib: int
    nvlink_domain: str | None = None
    mig_capable: bool = False


class NodeRegistered(Event, frozen=True, kw_only=True, tag="io.ibpool.node.node.registered.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "A node agent announced its node and inventory (on start and after a reconnect)."

    node_id: str
    hostname: str
    cpu_milli: int
    memory_mib: int
    gpus: list[GpuInfo]
    backend: str
    labels: dict[str, str] = {}
    api_url: str | None = None


class NodeDeregistered(Event, frozen=True, kw_only=True, tag="io.ibpool.node.node.deregistered.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "A node agent stopped cleanly and took its node out of service."

    node_id: str
    reason: str


class NodeHeartbeat(Event, frozen=True, kw_only=True, tag="io.ibpool.node.heartbeat.sent.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "A node agent is alive; sent every `interval_s`, on core NATS only (not stored)."
    # One per node per interval: 12,500 a second at 100,000 GPUs. A lost beat is replaced by the next,
    # a restarted reader gives every node a fresh window, so none is stored.
    stored: ClassVar[bool] = False

    node_id: str
    seq: int
    interval_s: float
    running_allocations: list[str] = []


class GpuSample(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    uuid: str
    utilization_pct: float
    memory_used_mib: int
    temperature_c: float
    power_w: float
    ecc_volatile: int = 0
    ecc_aggregate: int = 0
    retired_pages: int = 0
    xids: list[int] = []
    throttle_reasons: list[str] = []


class HostSample(msgspec.Struct, frozen=True, kw_only=True):
    cpu_pct: float
    memory_used_mib: int
    net_rx_bps: float = 0.0
    net_tx_bps: float = 0.0
    disk_used_pct: float = 0.0


class TelemetryReported(Event, frozen=True, kw_only=True, tag="io.ibpool.node.telemetry.reported.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "GPU and host telemetry of one node at one instant."

    node_id: str
    gpus: list[GpuSample]
    host: HostSample | None = None


class HcaPort(msgspec.Struct, frozen=True, kw_only=True):
    """One port of a host channel adapter, as the host's kernel shows it (sysfs)."""

    device: str
    port: int
    # The adapter's node GUID, "0x" and 16 lower-case hex digits (the topology's form).
    node_guid: str
    # The logical state: ACTIVE, DOWN, INIT, ARMED.
    state: str
    width: int | None = None
    lane_gbps: float | None = None
    counters: dict[str, int] = {}


class HcaPortsReported(Event, frozen=True, kw_only=True, tag="io.ibpool.node.hca.reported.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = (
        "The InfiniBand ports of a node's adapters as its kernel shows them, for link health without a fabric manager."
    )

    node_id: str
    ports: list[HcaPort]
