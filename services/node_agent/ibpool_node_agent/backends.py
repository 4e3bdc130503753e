"""GPU backends: NVML on hosts with NVIDIA GPUs, the seeded simulation everywhere else."""

from __future__ import annotations

import socket
import time
from typing import Protocol

import psutil

from ibpool_core.gpu_model import SimulatedGpus
from ibpool_proto.node import GpuInfo, GpuSample, HostSample

from .config import NodeAgentConfig
from .enforcers import Enforcer, NvmlEnforcer, SimulatedEnforcer


class GpuBackend(Protocol):
    name: str
    node_id: str
    hostname: str
    # Puts each grant's MIG / MPS / visibility limits in force on this node.
    enforcer: Enforcer

    def inventory(self) -> list[GpuInfo]: ...

    def sample(self, dt_s: float, load: dict[int, int]) -> list[GpuSample]:
        """Telemetry now; `load` is GPU index -> MiB that granted work uses (the simulation needs it)."""
        ...

    def host(self, load: dict[int, int]) -> HostSample:
        """The node's CPU, memory, network and disk now."""
        ...


class SimulatedBackend:
    name = "simulated"

    def __init__(self, node_id: str, cfg: NodeAgentConfig) -> None:
        self.node_id = node_id
        self.hostname = node_id
        self.model = SimulatedGpus(
            node_id=node_id,
            seed=cfg.seed,
            count=cfg.gpus_per_node,
            model=cfg.gpu_model,
            ecc_rate=cfg.sim_ecc_rate,
            xid_rate=cfg.sim_xid_rate,
        )
        self.enforcer: Enforcer = SimulatedEnforcer(node_id, self.model.inventory())

    def inventory(self) -> list[GpuInfo]:
        return self.model.inventory()

    def sample(self, dt_s: float, load: dict[int, int]) -> list[GpuSample]:
        return self.model.sample(dt_s, load)

    def host(self, load: dict[int, int]) -> HostSample:
        # A simulated node's host follows its work: each busy GPU keeps about 1.5 cores of 32 busy
        # feeding it and pins host memory for about a quarter of its GPU memory.
        busy = len(load)
        return HostSample(
            cpu_pct=min(100.0, 2.0 + busy * 150.0 / 32),
            memory_used_mib=4096 + sum(load.values()) // 4,
            net_rx_bps=busy * 2e8,
            net_tx_bps=busy * 2e8,
            disk_used_pct=35.0,
        )


class NvmlBackend:
    """Reads real GPUs through NVML (nvidia-ml-py): inventory and telemetry; enforces grants (MIG, MPS)."""

    name = "nvml"

    def __init__(self, node_id: str) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.node_id = node_id
        self.hostname = socket.gethostname()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.enforcer: Enforcer = NvmlEnforcer(pynvml, self.handles, self.inventory())
        self.host_meter = HostMeter()

    def inventory(self) -> list[GpuInfo]:
        n = self.nvml
        out = []
        for i, h in enumerate(self.handles):
            try:
                mig_capable = n.nvmlDeviceGetMigMode(h)[1] is not None
            except n.NVMLError:
                mig_capable = False
            name = n.nvmlDeviceGetName(h)
            out.append(
                GpuInfo(
                    index=i,
                    uuid=_text(n.nvmlDeviceGetUUID(h)),
                    model=_text(name),
                    memory_mib=int(n.nvmlDeviceGetMemoryInfo(h).total // (1 << 20)),
                    mig_capable=mig_capable,
                )
            )
        return out

    def host(self, load: dict[int, int]) -> HostSample:
        return self.host_meter.sample()

    def sample(self, dt_s: float, load: dict[int, int]) -> list[GpuSample]:
        n = self.nvml
        out = []
        for i, h in enumerate(self.handles):
            util = n.nvmlDeviceGetUtilizationRates(h)
            mem = n.nvmlDeviceGetMemoryInfo(h)
            try:
                ecc_v = int(n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC))
                ecc_a = int(
                    n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC)
                )
            except n.NVMLError:
                ecc_v = ecc_a = 0
            out.append(
                GpuSample(
                    index=i,
                    uuid=_text(n.nvmlDeviceGetUUID(h)),
                    utilization_pct=float(util.gpu),
                    memory_used_mib=int(mem.used // (1 << 20)),
                    temperature_c=float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
                    power_w=n.nvmlDeviceGetPowerUsage(h) / 1000.0,
                    ecc_volatile=ecc_v,
                    ecc_aggregate=ecc_a,
                )
            )
        return out


class HostMeter:
    """This machine's CPU, memory, network throughput (since the last sample) and root disk use (psutil)."""

    def __init__(self, disk_path: str = "/") -> None:
        self.disk_path = disk_path
        psutil.cpu_percent(None)  # the first call only starts the measurement window
        self._net = psutil.net_io_counters()
        self._at = time.monotonic()

    def sample(self) -> HostSample:
        now, net = time.monotonic(), psutil.net_io_counters()
        span = max(now - self._at, 1e-3)
        rx = (net.bytes_recv - self._net.bytes_recv) * 8 / span
        tx = (net.bytes_sent - self._net.bytes_sent) * 8 / span
        self._net, self._at = net, now
        return HostSample(
            cpu_pct=float(psutil.cpu_percent(None)),
            memory_used_mib=int(psutil.virtual_memory().used // (1 << 20)),
            net_rx_bps=max(0.0, rx),
            net_tx_bps=max(0.0, tx),
            disk_used_pct=float(psutil.disk_usage(self.disk_path).percent),
        )


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


def nvml_gpu_count() -> int:
    """How many GPUs NVML sees here; 0 when there is no driver or no GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def node_ids(cfg: NodeAgentConfig) -> list[str]:
    return [f"{cfg.node_prefix}-{i:03d}" for i in range(cfg.first_node, cfg.first_node + cfg.nodes)]


def make_backends(cfg: NodeAgentConfig) -> list[GpuBackend]:
    """NVML where a GPU is present (backend=auto) or required (nvml); the simulation otherwise."""
    use_nvml = cfg.backend == "nvml" or (cfg.backend == "auto" and nvml_gpu_count() > 0)
    if use_nvml:
        return [NvmlBackend(node_id=socket.gethostname().split(".")[0])]
    return [SimulatedBackend(n, cfg) for n in node_ids(cfg)]
