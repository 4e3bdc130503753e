"""GPU backends: NVML on hosts with NVIDIA GPUs, the seeded simulation everywhere else."""

from __future__ import annotations

import socket
import time
from typing import Any, Protocol

import msgspec
import psutil

from ibpool_core.gpu_model import SimulatedGpus
from ibpool_proto.node import GpuInfo, GpuSample, HostSample
from ibpool_runtime.logs import get_logger

from .config import NodeAgentConfig
from .enforcers import Enforcer, NvmlEnforcer, SimulatedEnforcer

log = get_logger(__name__)


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
        # GPU index -> XID codes injected since the last sample (a fault drill), reported by the next one.
        self.injected_xids: dict[int, list[int]] = {}

    def inventory(self) -> list[GpuInfo]:
        return self.model.inventory()

    def inject_xid(self, index: int, code: int) -> None:
        """The GPU `index` reports XID `code` in the next sample, as NVML would after the fault."""
        if not 0 <= index < self.model.count:
            raise ValueError(f"node {self.node_id} has no GPU {index} (0..{self.model.count - 1})")
        self.injected_xids.setdefault(index, []).append(code)

    def sample(self, dt_s: float, load: dict[int, int]) -> list[GpuSample]:
        out = self.model.sample(dt_s, load)
        if self.injected_xids:
            injected, self.injected_xids = self.injected_xids, {}
            out = [
                msgspec.structs.replace(g, xids=[*g.xids, *injected[g.index]]) if g.index in injected else g
                for g in out
            ]
        return out

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


# NVML clock event (throttle) reason bits -> the names telemetry uses; idle and app-clock settings are not problems.
THROTTLE_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}


class NvmlBackend:
    """Reads real GPUs through NVML (nvidia-ml-py) and enforces grants on them (MIG, MPS).

    Inventory: UUID, model, memory, MIG mode, NVLink (a GPU with an active NVLink is in the host's
    NVLink domain). Telemetry: utilisation, memory, temperature, power, volatile and aggregate
    uncorrected ECC, retired pages (or remapped rows on GPUs that remap instead of retiring),
    throttle reasons, and the XIDs NVML reported since the last sample (an event set, read without
    waiting). A figure a GPU does not support is left at its default. `nvml` is the nvidia-ml-py
    module; tests pass a stand-in.
    """

    name = "nvml"

    def __init__(self, node_id: str, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.nvml = nvml
        nvml.nvmlInit()
        self.node_id = node_id
        self.hostname = socket.gethostname()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self.events = self._xid_events()
        self.enforcer: Enforcer = NvmlEnforcer(nvml, self.handles, self.inventory())
        self.host_meter = HostMeter()

    def _xid_events(self) -> Any:
        n = self.nvml
        try:
            events = n.nvmlEventSetCreate()
            for h in self.handles:
                n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, events)
            return events
        except n.NVMLError as e:  # e.g. not supported in a container without the right caps
            log.warning("XID events unavailable: telemetry carries no XIDs", error=str(e))
            return None

    def inventory(self) -> list[GpuInfo]:
        n = self.nvml
        out = []
        for i, h in enumerate(self.handles):
            try:
                mig_capable = n.nvmlDeviceGetMigMode(h)[1] is not None
            except n.NVMLError:
                mig_capable = False
            out.append(
                GpuInfo(
                    index=i,
                    uuid=_text(n.nvmlDeviceGetUUID(h)),
                    model=_text(n.nvmlDeviceGetName(h)),
                    memory_mib=int(n.nvmlDeviceGetMemoryInfo(h).total // (1 << 20)),
                    mig_capable=mig_capable,
                    nvlink_domain=self.hostname if self._nvlink_active(h) else None,
                )
            )
        return out

    def host(self, load: dict[int, int]) -> HostSample:
        return self.host_meter.sample()

    def _nvlink_active(self, h: Any) -> bool:
        n = self.nvml
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            try:
                if n.nvmlDeviceGetNvLinkState(h, link) == n.NVML_FEATURE_ENABLED:
                    return True
            except n.NVMLError:
                return False  # no such link: the GPU has no more
        return False

    def sample(self, dt_s: float, load: dict[int, int]) -> list[GpuSample]:
        n = self.nvml
        xids = self._pending_xids()
        out = []
        for i, h in enumerate(self.handles):
            util = n.nvmlDeviceGetUtilizationRates(h)
            mem = n.nvmlDeviceGetMemoryInfo(h)
            out.append(
                GpuSample(
                    index=i,
                    uuid=_text(n.nvmlDeviceGetUUID(h)),
                    utilization_pct=float(util.gpu),
                    memory_used_mib=int(mem.used // (1 << 20)),
                    temperature_c=float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
                    power_w=n.nvmlDeviceGetPowerUsage(h) / 1000.0,
                    ecc_volatile=self._ecc(h, n.NVML_VOLATILE_ECC),
                    ecc_aggregate=self._ecc(h, n.NVML_AGGREGATE_ECC),
                    retired_pages=self._retired(h),
                    xids=xids.get(i, []),
                    throttle_reasons=self._throttle(h),
                )
            )
        return out

    def _ecc(self, h: Any, counter: int) -> int:
        n = self.nvml
        try:
            return int(n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter))
        except n.NVMLError:
            return 0

    def _retired(self, h: Any) -> int:
        n = self.nvml
        try:
            return sum(
                len(n.nvmlDeviceGetRetiredPages(h, cause))
                for cause in (
                    n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                    n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
                )
            )
        except n.NVMLError:
            pass
        try:  # A100 and later remap rows instead of retiring pages
            corrected, uncorrected, _pending, _failed = n.nvmlDeviceGetRemappedRows(h)
            return int(corrected + uncorrected)
        except n.NVMLError:
            return 0

    def _throttle(self, h: Any) -> list[str]:
        n = self.nvml
        try:
            mask = int(n.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        except n.NVMLError:
            return []
        return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]

    def _pending_xids(self) -> dict[int, list[int]]:
        """GPU index -> XID codes NVML reported since the last call (never waits)."""
        n = self.nvml
        out: dict[int, list[int]] = {}
        if self.events is None:
            return out
        for _ in range(1000):  # bounded: a storm of XIDs must not stall telemetry
            try:
                data = n.nvmlEventSetWait_v2(self.events, 0)
            except n.NVMLError:  # NVML_ERROR_TIMEOUT: nothing more pending
                break
            if data.eventType & n.nvmlEventTypeXidCriticalError:
                out.setdefault(int(n.nvmlDeviceGetIndex(data.device)), []).append(int(data.eventData))
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
    prefix = node_prefix(cfg)
    return [f"{prefix}-{i:03d}" for i in range(cfg.first_node, cfg.first_node + cfg.nodes)]


def node_prefix(cfg: NodeAgentConfig) -> str:
    """The configured prefix, with "{hostname}" replaced: replicas of one container spec get their own ids."""
    return cfg.node_prefix.replace("{hostname}", socket.gethostname().split(".")[0])


def make_backends(cfg: NodeAgentConfig) -> list[GpuBackend]:
    """NVML where a GPU is present (backend=auto) or required (nvml); the simulation otherwise."""
    use_nvml = cfg.backend == "nvml" or (cfg.backend == "auto" and nvml_gpu_count() > 0)
    if use_nvml:
        return [NvmlBackend(node_id=socket.gethostname().split(".")[0])]
    return [SimulatedBackend(n, cfg) for n in node_ids(cfg)]
