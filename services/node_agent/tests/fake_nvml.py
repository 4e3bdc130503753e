"""An in-memory stand-in for the part of nvidia-ml-py the node agent calls, for machines without a GPU.

One or more A100 80GB GPUs in MIG mode: GPU instances at placements (overlaps refused as the
driver refuses them), compute instances, MIG device handles; and per-GPU telemetry that tests
set: utilisation, memory, temperature, power, ECC, retired pages or remapped rows, throttle
reasons, NVLink state, and XID events on an event set whose wait blocks up to its timeout as
NVML's does.

Fidelity: the errors are nvidia-ml-py's own (`pynvml.NVMLError(code)`, whose subclasses such as
`NVMLError_NotSupported` the backend may test for), every constant is taken from pynvml, the
structures returned are pynvml's ctypes structures (the event data excepted: its `device` is a
pointer to a real handle, so it is a namespace with the structure's field names), and
`test_fake_nvml_fidelity.py` checks every function's signature against pynvml's.
`failing[function name] = code` makes a call fail with that NVML error code.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pynvml
from pynvml import NVMLError


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


def _error(code: int) -> NVMLError:
    return NVMLError(code)


class FakeNvml:
    """The NVML calls the node agent makes, on A100 80GB GPUs in MIG mode, keeping everything in memory."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = pynvml.NVML_AGGREGATE_ECC
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = (
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    )
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_GPU_INSTANCE_PROFILE_COUNT = pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
    NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE
    NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE
    NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE
    NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE
    c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t
    # A100 80GB GPU instance profile id -> (compute slices, memory MB): 1g.10gb, 2g.20gb, 3g.40gb,
    # 4g.40gb, 7g.80gb, 1g.10gb+me, 1g.20gb
    PROFILES = {0: (1, 9856), 1: (2, 19968), 2: (3, 40192), 3: (4, 40192), 4: (7, 80384), 7: (1, 9856), 9: (1, 19968)}
    MEMORY_SLICES = {0: 1, 1: 2, 2: 4, 3: 4, 4: 8, 7: 1, 9: 2}

    def __init__(self, mig_enabled: bool = True, gpus: int = 1, events_supported: bool = True) -> None:
        self.gpus = [FakeGpu(i) for i in range(gpus)]
        self.events_supported = events_supported
        self.event_queue: list[tuple[int, int]] = []  # (gpu index, XID)
        self._events_changed = threading.Condition()
        self.registered: set[int] = set()
        self.initialised = False
        self.mig_mode = 1 if mig_enabled else 0
        self.instances: dict[int, tuple[int, int, int]] = {}  # gi id -> (profile, start, size)
        self.compute: dict[int, int] = {}  # ci handle -> gi id
        self.next_id = 1
        self.fail_compute = False
        # function name -> NVML error code it fails with (a GPU fallen off the bus, a driver fault)
        self.failing: dict[str, int] = {}

    def _check(self, function: str) -> None:
        if function in self.failing:
            raise _error(self.failing[function])

    def raise_xid(self, index: int, xid: int) -> None:
        """The GPU `index` reports XID `xid` now: a waiting `nvmlEventSetWait_v2` returns it at once."""
        with self._events_changed:
            self.event_queue.append((index, xid))
            self._events_changed.notify_all()

    # -- MIG

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        return [self.mig_mode, self.mig_mode]

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int, version: int = 2) -> Any:
        if profile not in self.PROFILES:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        slices, mb = self.PROFILES[profile]
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()  # its constructor sets only the version
        info.id, info.sliceCount, info.memorySizeMB = profile, slices, mb
        return info

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: Any, profileId: int, placement: Any) -> int:
        assert placement.size == self.MEMORY_SLICES[profileId]
        span = set(range(placement.start, placement.start + placement.size))
        for _, start, size in self.instances.values():
            if span & set(range(start, start + size)):
                raise _error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi = self.next_id
        self.next_id += 1
        self.instances[gi] = (profileId, placement.start, placement.size)
        return gi

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: int, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id = profile
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: int, profileId: int) -> int:
        if self.fail_compute:
            raise _error(pynvml.NVML_ERROR_UNKNOWN)
        ci = 1000 + gpuInstance
        self.compute[ci] = gpuInstance
        return ci

    def nvmlGpuInstanceGetInfo(self, gpuInstance: int) -> Any:
        return pynvml.c_nvmlGpuInstanceInfo_t(id=gpuInstance)

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> int:
        live = sorted(self.compute.values())
        if index >= len(live):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return live[index]

    def nvmlDeviceGetGpuInstanceId(self, device: int) -> int:
        return device

    def nvmlDeviceGetUUID(self, handle: int | FakeGpu) -> str:
        # nvidia-ml-py decodes the C string (convertStrBytes): str, as here
        if isinstance(handle, FakeGpu):
            return f"GPU-fake-{handle.index}"
        return f"MIG-fake-{handle}"

    def nvmlComputeInstanceDestroy(self, computeInstance: int) -> None:
        del self.compute[computeInstance]

    def nvmlGpuInstanceDestroy(self, gpuInstance: int) -> None:
        del self.instances[gpuInstance]

    # -- devices and telemetry (handles are the FakeGpu objects)

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return "fake"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetIndex(self, handle: FakeGpu) -> int:
        return handle.index

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> Any:
        self._check("nvmlDeviceGetPciInfo")
        bus = 0x07 + 0x10 * handle.index
        return pynvml.nvmlPciInfo_t(busId=f"00000000:{bus:02X}:00.0".encode(), domain=0, bus=bus, device=0)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu, version: int | None = None) -> Any:
        self._check("nvmlDeviceGetMemoryInfo")
        total, used = 81920 << 20, handle.used_mib << 20
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> Any:
        self._check("nvmlDeviceGetUtilizationRates")
        return pynvml.c_nvmlUtilization_t(gpu=handle.util, memory=0)

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature")
        return handle.temperature

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetPowerUsage")
        return handle.power_mw

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeGpu, errorType: int, counterType: int) -> int:
        self._check("nvmlDeviceGetTotalEccErrors")
        return handle.ecc[counterType]

    def nvmlDeviceGetRetiredPages(self, device: FakeGpu, sourceFilter: int) -> list[int]:
        self._check("nvmlDeviceGetRetiredPages")
        if device.retired is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return device.retired if sourceFilter == 1 else []

    def nvmlDeviceGetRemappedRows(self, device: FakeGpu) -> tuple[int, int, int, int]:
        self._check("nvmlDeviceGetRemappedRows")
        return device.remapped

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetCurrentClocksThrottleReasons")
        return handle.throttle

    def nvmlDeviceGetNvLinkState(self, device: FakeGpu, link: int) -> int:
        if link >= device.nvlinks:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1

    def nvmlEventSetCreate(self) -> str:
        if not self.events_supported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return "event-set"

    def nvmlEventSetFree(self, eventSet: str) -> None:
        pass

    def nvmlDeviceRegisterEvents(self, handle: FakeGpu, eventTypes: int, eventSet: str) -> None:
        self.registered.add(handle.index)

    def nvmlEventSetWait_v2(self, eventSet: str, timeoutms: int) -> Any:
        self._check("nvmlEventSetWait_v2")
        with self._events_changed:
            self._events_changed.wait_for(lambda: bool(self.event_queue), timeout=timeoutms / 1000)
            if not self.event_queue:
                raise _error(pynvml.NVML_ERROR_TIMEOUT)
            index, xid = self.event_queue.pop(0)
        return SimpleNamespace(
            device=self.gpus[index],
            eventType=pynvml.nvmlEventTypeXidCriticalError,
            eventData=xid,
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )
