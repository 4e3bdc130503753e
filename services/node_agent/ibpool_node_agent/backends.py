"""GPU backends: NVML on hosts with NVIDIA GPUs, the seeded simulation everywhere else."""

from __future__ import annotations

import functools
import hashlib
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import msgspec

from ibpool_core.gpu_model import SimulatedGpus
from ibpool_proto.node import GpuInfo, GpuSample
from ibpool_runtime.bus_permissions import agent_nodes
from ibpool_runtime.logs import get_logger

from .config import NodeAgentConfig
from .enforcers import Enforcer, NvmlEnforcer, SimulatedEnforcer

log = get_logger(__name__)

T = TypeVar("T")


class ReadFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A figure the backend could not read: which kind (e.g. "temperature", "xid_events"), of which GPU, and why."""

    kind: str
    error: str
    gpu_index: int | None = None


class Reading(msgspec.Struct, frozen=True, kw_only=True):
    """One telemetry sample of a node's GPUs, and what could not be read for it (left at its default)."""

    gpus: list[GpuSample]
    failures: list[ReadFailure] = []


class GpuBackend(Protocol):
    name: str
    node_id: str
    hostname: str
    # Puts each grant's MIG / MPS / visibility limits in force on this node.
    enforcer: Enforcer
    # Whether `watch_xids` waits on a real event source (then the agent runs it between samples).
    watches_xids: bool
    # GPU index -> PCI bus id ("00000000:07:00.0") where the backend reads one (NVML), and the GPU
    # driver's version (None where there is no driver): labels of the dcgm-exporter metrics (dcgm.py).
    pci_bus_ids: dict[int, str]
    driver_version: str | None

    def inventory(self) -> list[GpuInfo]: ...

    def sample(self, dt_s: float, load: dict[int, int]) -> Reading:
        """Telemetry now; `load` is GPU index -> MiB that granted work uses (the simulation needs it).
        Never raises for a figure it cannot read: the figure keeps its default and the reading says why."""
        ...

    def watch_xids(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for XIDs (blocking: run it in a thread) and keep them for the next
        sample; how many arrived."""
        ...


class SimulatedBackend:
    name = "simulated"
    watches_xids = False

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
        self.pci_bus_ids: dict[int, str] = {}  # a simulated GPU sits on no bus
        self.driver_version: str | None = None
        # GPU index -> XID codes injected since the last sample (a fault drill), reported by the next one.
        self.injected_xids: dict[int, list[int]] = {}

    def inventory(self) -> list[GpuInfo]:
        return self.model.inventory()

    def inject_xid(self, index: int, code: int) -> None:
        """The GPU `index` reports XID `code` in the next sample, as NVML would after the fault."""
        if not 0 <= index < self.model.count:
            raise ValueError(f"node {self.node_id} has no GPU {index} (0..{self.model.count - 1})")
        self.injected_xids.setdefault(index, []).append(code)

    def watch_xids(self, timeout_s: float) -> int:
        return 0  # injected XIDs are taken by the next sample, which the drill asks for at once

    def sample(self, dt_s: float, load: dict[int, int]) -> Reading:
        out = self.model.sample(dt_s, load)
        if self.injected_xids:
            injected, self.injected_xids = self.injected_xids, {}
            out = [
                msgspec.structs.replace(g, xids=[*g.xids, *injected[g.index]]) if g.index in injected else g
                for g in out
            ]
        return Reading(gpus=out)


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
    NVLink domain); once, at start, each GPU's PCI bus id and the driver's version (labels of the
    dcgm-exporter metrics, left out when they cannot be read). Telemetry: utilisation, memory,
    temperature, power, volatile and aggregate uncorrected ECC, retired pages (or remapped rows on
    GPUs that remap instead of retiring), throttle reasons, and the XIDs NVML reported since the
    last sample. XIDs are waited for on an NVML event set by `watch_xids` (the agent runs it in a
    thread between samples and samples at once when one arrives). A figure a GPU does not support
    (NVML_ERROR_NOT_SUPPORTED) is left at its default; any other NVML error leaves it at its
    default too and is returned as a `ReadFailure` of its kind. `nvml` is the nvidia-ml-py module;
    tests pass a stand-in.
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
        self.driver_version = self._driver_version()
        self.pci_bus_ids = self._pci_bus_ids()
        # XIDs and event-set failures seen by `watch_xids` (a thread) until the next sample takes them.
        self._pending_lock = threading.Lock()
        self._pending_xids: dict[int, list[int]] = {}
        self._pending_failures: list[ReadFailure] = []
        self.events = self._xid_events()
        self.watches_xids = self.events is not None
        self.enforcer: Enforcer = NvmlEnforcer(nvml, self.handles, self.inventory())

    def _xid_events(self) -> Any:
        n = self.nvml
        try:
            events = n.nvmlEventSetCreate()
            for h in self.handles:
                n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, events)
            return events
        except n.NVMLError as e:  # e.g. not supported in a container without the right caps
            log.warning("XID events unavailable: telemetry carries no XIDs", node_id=self.node_id, error=str(e))
            return None

    def _driver_version(self) -> str | None:
        try:
            return _text(self.nvml.nvmlSystemGetDriverVersion())
        except self.nvml.NVMLError as e:
            log.warning("driver version not read", node_id=self.node_id, error=str(e))
            return None

    def _pci_bus_ids(self) -> dict[int, str]:
        """GPU index -> NVML's PCI bus id, read once (it does not change while the driver runs)."""
        n = self.nvml
        out: dict[int, str] = {}
        for i, h in enumerate(self.handles):
            try:
                out[i] = _text(n.nvmlDeviceGetPciInfo(h).busId)
            except n.NVMLError as e:
                log.warning("PCI bus id not read", node_id=self.node_id, gpu_index=i, error=str(e))
        return out

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

    def _nvlink_active(self, h: Any) -> bool:
        n = self.nvml
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            try:
                if n.nvmlDeviceGetNvLinkState(h, link) == n.NVML_FEATURE_ENABLED:
                    return True
            except n.NVMLError:
                return False  # no such link: the GPU has no more
        return False

    def sample(self, dt_s: float, load: dict[int, int]) -> Reading:
        with self._pending_lock:
            xids, self._pending_xids = self._pending_xids, {}
            failures, self._pending_failures = self._pending_failures, []
        gpus = [self._gpu_sample(i, h, xids.get(i, []), failures) for i, h in enumerate(self.handles)]
        return Reading(gpus=gpus, failures=failures)

    def _gpu_sample(self, i: int, h: Any, xids: list[int], failures: list[ReadFailure]) -> GpuSample:
        n = self.nvml

        def read(kind: str, call: Callable[[], T], default: T) -> T:
            try:
                return call()
            except n.NVMLError as e:
                if e.value != n.NVML_ERROR_NOT_SUPPORTED:
                    failures.append(ReadFailure(kind=kind, gpu_index=i, error=str(e)))
                return default

        no_reasons: list[str] = []
        return GpuSample(
            index=i,
            uuid=self._uuids[i],
            utilization_pct=read("utilization", lambda: float(n.nvmlDeviceGetUtilizationRates(h).gpu), 0.0),
            memory_used_mib=read("memory", lambda: int(n.nvmlDeviceGetMemoryInfo(h).used // (1 << 20)), 0),
            temperature_c=read(
                "temperature", lambda: float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)), 0.0
            ),
            power_w=read("power", lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0, 0.0),
            ecc_volatile=read("ecc", lambda: self._ecc(h, n.NVML_VOLATILE_ECC), 0),
            ecc_aggregate=read("ecc", lambda: self._ecc(h, n.NVML_AGGREGATE_ECC), 0),
            retired_pages=read("retired_pages", lambda: self._retired(h), 0),
            xids=xids,
            throttle_reasons=read("throttle", lambda: self._throttle(h), no_reasons),
        )

    @functools.cached_property
    def _uuids(self) -> list[str]:
        return [_text(self.nvml.nvmlDeviceGetUUID(h)) for h in self.handles]

    def _ecc(self, h: Any, counter: int) -> int:
        n = self.nvml
        return int(n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter))

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
        except n.NVMLError as e:
            if e.value != n.NVML_ERROR_NOT_SUPPORTED:
                raise
        # A100 and later remap rows instead of retiring pages
        corrected, uncorrected, _pending, _failed = n.nvmlDeviceGetRemappedRows(h)
        return int(corrected + uncorrected)

    def _throttle(self, h: Any) -> list[str]:
        mask = int(self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]

    def watch_xids(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` on the event set for XIDs, then take whatever else is pending
        (bounded: a storm of XIDs must not starve the sample); kept for the next sample."""
        n = self.nvml
        if self.events is None:
            return 0
        got = 0
        wait_ms = max(0, int(timeout_s * 1000))
        for _ in range(1000):
            try:
                data = n.nvmlEventSetWait_v2(self.events, wait_ms)
            except n.NVMLError as e:
                if e.value != n.NVML_ERROR_TIMEOUT:
                    with self._pending_lock:
                        self._pending_failures.append(ReadFailure(kind="xid_events", error=str(e)))
                    if got == 0:
                        time.sleep(timeout_s)  # a failing event set is not waited on in a tight loop
                break
            wait_ms = 0
            if data.eventType & n.nvmlEventTypeXidCriticalError:
                try:
                    index = int(n.nvmlDeviceGetIndex(data.device))
                except n.NVMLError as e:
                    with self._pending_lock:
                        self._pending_failures.append(
                            ReadFailure(kind="xid_events", error=f"XID {data.eventData} of an unknown GPU: {e}")
                        )
                    continue
                with self._pending_lock:
                    self._pending_xids.setdefault(index, []).append(int(data.eventData))
                got += 1
        return got


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


def nvml_gpu_count() -> int:
    """How many GPUs NVML sees here; 0 when there is no driver (no libnvidia-ml) or no GPU."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # NVML_ERROR_LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED, ...
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def node_ids(cfg: NodeAgentConfig) -> list[str]:
    return list(agent_nodes(node_prefix(cfg), cfg.first_node, cfg.nodes))


def store_schema(cfg: NodeAgentConfig) -> str:
    """The agent's own schema in the store: `node_agent_<prefix>_<first>_<count>` as a SQL identifier.
    Each agent keeps its nodes, workloads and outbox apart, so its outbox relay publishes only its
    own nodes' news (all that a user of its own may publish: `bus_permissions.agent_permissions`)."""
    raw = f"node_agent_{node_prefix(cfg)}_{cfg.first_node}_{cfg.nodes}".lower()
    name = re.sub(r"[^a-z0-9_]", "_", raw)
    return name if len(name) <= 63 else f"{name[:54]}_{hashlib.sha256(raw.encode()).hexdigest()[:8]}"


def node_prefix(cfg: NodeAgentConfig) -> str:
    """The configured prefix, with "{hostname}" replaced: replicas of one container spec get their own ids."""
    return cfg.node_prefix.replace("{hostname}", socket.gethostname().split(".")[0])


def make_backends(cfg: NodeAgentConfig) -> list[GpuBackend]:
    """NVML where a GPU is present (backend=auto) or required (nvml); the simulation otherwise."""
    use_nvml = cfg.backend == "nvml" or (cfg.backend == "auto" and nvml_gpu_count() > 0)
    if use_nvml:
        return [NvmlBackend(node_id=socket.gethostname().split(".")[0])]
    return [SimulatedBackend(n, cfg) for n in node_ids(cfg)]
