"""An in-memory stand-in for the part of nvidia-ml-py the node agent calls, for machines without a GPU.

One or more A100 80GB GPUs in MIG mode: GPU instances at placements (overlaps refused as the
driver refuses them), compute instances, MIG device handles; and per-GPU telemetry that tests
set: utilisation, memory, temperature, power, ECC, retired pages or remapped rows, throttle
reasons, NVLink state, and XID events queued on an event set.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


class FakeNvmlError(Exception):
    pass


class FakeGpu:
    """What one fake GPU reports; tests change the fields."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.util = 0
        self.used_mib = 0
        self.temperature = 35
        self.power_mw = 60_000
        self.ecc = {0: 0, 1: 0}  # volatile, aggregate
        self.retired: list[int] | None = []  # None: not supported (the GPU remaps rows)
        self.remapped = (0, 0, 0, 0)
        self.throttle = 0
        self.nvlinks = 12


class FakeNvml:
    """The NVML calls the node agent makes, on A100 80GB GPUs in MIG mode, keeping everything in memory."""

    NVMLError = FakeNvmlError
    NVML_TEMPERATURE_GPU = 0
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1
    nvmlEventTypeXidCriticalError = 0x8
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_GPU_INSTANCE_PROFILE_COUNT = 18
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
    NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0
    NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 1
    NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 2
    NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 3
    NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 4
    # profile id -> (compute slices, memory MB): 1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb, 1g.10gb+me, 1g.20gb
    PROFILES = {0: (1, 9856), 1: (2, 19968), 2: (3, 40192), 3: (4, 40192), 4: (7, 80384), 7: (1, 9856), 9: (1, 19968)}
    MEMORY_SLICES = {0: 1, 1: 2, 2: 4, 3: 4, 4: 8, 7: 1, 9: 2}

    class c_nvmlGpuInstancePlacement_t:
        start = 0
        size = 0

    def __init__(self, mig_enabled: bool = True, gpus: int = 1, events_supported: bool = True) -> None:
        self.gpus = [FakeGpu(i) for i in range(gpus)]
        self.events_supported = events_supported
        self.event_queue: list[tuple[int, int]] = []  # (gpu index, XID)
        self.registered: set[int] = set()
        self.initialised = False
        self.mig_mode = 1 if mig_enabled else 0
        self.instances: dict[int, tuple[int, int, int]] = {}  # gi id -> (profile, start, size)
        self.compute: dict[int, int] = {}  # ci handle -> gi id
        self.next_id = 1
        self.fail_compute = False

    def nvmlDeviceGetMigMode(self, h: Any) -> tuple[int, int]:
        return self.mig_mode, self.mig_mode

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: Any, pid: int) -> Any:
        if pid not in self.PROFILES:
            raise FakeNvmlError("Not Supported")
        slices, mb = self.PROFILES[pid]
        return SimpleNamespace(id=pid, sliceCount=slices, memorySizeMB=mb)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: Any, pid: int, p: Any) -> int:
        assert p.size == self.MEMORY_SLICES[pid]
        span = set(range(p.start, p.start + p.size))
        for _, start, size in self.instances.values():
            if span & set(range(start, start + size)):
                raise FakeNvmlError("Insufficient Resources")
        gi = self.next_id
        self.next_id += 1
        self.instances[gi] = (pid, p.start, p.size)
        return gi

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: int, profile: int, eng: int) -> Any:
        return SimpleNamespace(id=profile)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: int, pid: int) -> int:
        if self.fail_compute:
            raise FakeNvmlError("Unknown Error")
        ci = 1000 + gi
        self.compute[ci] = gi
        return ci

    def nvmlGpuInstanceGetInfo(self, gi: int) -> Any:
        return SimpleNamespace(id=gi)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, i: int) -> int:
        live = sorted(self.compute.values())
        if i >= len(live):
            raise FakeNvmlError("Not Found")
        return live[i]

    def nvmlDeviceGetGpuInstanceId(self, mh: int) -> int:
        return mh

    def nvmlDeviceGetUUID(self, mh: int | FakeGpu) -> bytes:
        if isinstance(mh, FakeGpu):
            return f"GPU-fake-{mh.index}".encode()
        return f"MIG-fake-{mh}".encode()

    def nvmlComputeInstanceDestroy(self, ci: int) -> None:
        del self.compute[ci]

    def nvmlGpuInstanceDestroy(self, gi: int) -> None:
        del self.instances[gi]

    # -- devices and telemetry (handles are the FakeGpu objects)

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetIndex(self, h: FakeGpu) -> int:
        return h.index

    def nvmlDeviceGetName(self, h: FakeGpu) -> bytes:
        return b"NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        return SimpleNamespace(total=81920 << 20, used=h.used_mib << 20)

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        return SimpleNamespace(gpu=h.util, memory=0)

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        return h.temperature

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return h.power_mw

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, kind: int, counter: int) -> int:
        return h.ecc[counter]

    def nvmlDeviceGetRetiredPages(self, h: FakeGpu, cause: int) -> list[int]:
        if h.retired is None:
            raise FakeNvmlError("Not Supported")
        return h.retired if cause == 1 else []

    def nvmlDeviceGetRemappedRows(self, h: FakeGpu) -> tuple[int, int, int, int]:
        return h.remapped

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGpu) -> int:
        return h.throttle

    def nvmlDeviceGetNvLinkState(self, h: FakeGpu, link: int) -> int:
        if link >= h.nvlinks:
            raise FakeNvmlError("Invalid Argument")
        return 1

    def nvmlEventSetCreate(self) -> str:
        if not self.events_supported:
            raise FakeNvmlError("Not Supported")
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: FakeGpu, kinds: int, events: str) -> None:
        self.registered.add(h.index)

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        if not self.event_queue:
            raise FakeNvmlError("Timeout")
        index, xid = self.event_queue.pop(0)
        return SimpleNamespace(device=self.gpus[index], eventType=0x8, eventData=xid)
