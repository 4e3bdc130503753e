"""Making a grant's limits real on the node: MIG instances, MPS / HAMi-core limits, device visibility.

One enforcer per hosted node. The simulated enforcer keeps each GPU's MIG layout and every
allocation's limits in memory and refuses what real hardware would refuse (an instance that
overlaps another, a profile the model lacks, a device the node does not have). The NVML enforcer
creates and destroys MIG GPU and compute instances on the real GPUs and starts the MPS control
daemon for fractional grants; the MPS and HAMi-core limits themselves are per-client environment
variables that the launcher gives the workload.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from ibpool_core.pool import mig
from ibpool_core.pool.enforcement import format_mig_instance, parse_mig_instance
from ibpool_proto.node import GpuInfo
from ibpool_proto.pool import Enforcement
from ibpool_runtime.logs import get_logger

log = get_logger(__name__)


class EnforcementError(Exception):
    """The grant cannot be enforced here; the message says what and why. Nothing was left applied."""


class Applied(msgspec.Struct, frozen=True, kw_only=True):
    """What one allocation has in force on this node."""

    allocation_id: str
    # The environment the workload runs with (device visibility, MPS and HAMi-core limits).
    env: dict[str, str] = {}
    # "<gpu index>:<profile>@<start>" of the MIG instances created for it, and their device UUIDs.
    mig_instances: list[str] = []
    mig_devices: list[str] = []
    memory_limit_mib: int | None = None


class Enforcer(Protocol):
    def apply(self, allocation_id: str, enforcement: Enforcement) -> Applied:
        """Put the grant's limits in force and return the workload's environment.

        Idempotent: applying the same allocation again returns what is in force. Raises
        EnforcementError with the reason when the node cannot honour it; then nothing of it is
        left applied (a half-created MIG layout is torn down).
        """
        ...

    def release(self, allocation_id: str) -> None:
        """Undo `apply` (destroy its MIG instances). Unknown ids are ignored: releasing is idempotent."""
        ...

    def in_force(self) -> list[Applied]:
        """Everything applied now, by allocation."""
        ...


def _applied(
    allocation_id: str,
    enforcement: Enforcement,
    instances: Sequence[tuple[int, mig.MigInstance]],
    mig_devices: Sequence[str],
) -> Applied:
    """What is in force once the instances exist: the grant's environment, MIG devices made visible."""
    env = dict(enforcement.env)
    if mig_devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(mig_devices)
    return Applied(
        allocation_id=allocation_id,
        env=env,
        mig_instances=[format_mig_instance(i, m) for i, m in instances],
        mig_devices=list(mig_devices),
        memory_limit_mib=enforcement.memory_limit_mib,
    )


def _parse_instances(enforcement: Enforcement, gpus: Sequence[GpuInfo]) -> list[tuple[int, mig.MigInstance]]:
    out = []
    for text in enforcement.mig_instances:
        try:
            index, instance = parse_mig_instance(text)
        except ValueError as e:
            raise EnforcementError(str(e)) from None
        if not 0 <= index < len(gpus):
            raise EnforcementError(f"MIG instance {text!r}: GPU {index} does not exist (node has {len(gpus)})")
        if not gpus[index].mig_capable:
            raise EnforcementError(f"MIG instance {text!r}: GPU {index} ({gpus[index].model}) is not MIG-capable")
        out.append((index, instance))
    return out


def _check_devices(enforcement: Enforcement, gpus: Sequence[GpuInfo]) -> None:
    known = {g.uuid for g in gpus}
    unknown = [d for d in enforcement.visible_devices if d not in known]
    if unknown:
        raise EnforcementError(f"devices {unknown} are not on this node")


class SimulatedEnforcer:
    """Keeps the MIG layout of each simulated GPU and checks it as the hardware would."""

    def __init__(self, node_id: str, gpus: Sequence[GpuInfo]) -> None:
        self.node_id = node_id
        self.gpus = list(gpus)
        self.applied: dict[str, Applied] = {}

    def layout(self, index: int) -> list[mig.MigInstance]:
        """The MIG instances in force on GPU `index`."""
        out = []
        for a in self.applied.values():
            for text in a.mig_instances:
                i, instance = parse_mig_instance(text)
                if i == index:
                    out.append(instance)
        return out

    def apply(self, allocation_id: str, enforcement: Enforcement) -> Applied:
        if (done := self.applied.get(allocation_id)) is not None:
            return done
        _check_devices(enforcement, self.gpus)
        instances = _parse_instances(enforcement, self.gpus)
        devices = []
        for index, instance in instances:
            model = self.gpus[index].model
            try:
                valid = mig.is_valid(model, [*self.layout(index), instance])
            except mig.MigError as e:
                raise EnforcementError(f"GPU {index}: {e}") from None
            if not valid:
                raise EnforcementError(
                    f"GPU {index}: {instance.profile} at slice {instance.start} overlaps the instances in force"
                )
            devices.append(f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'{self.node_id}/{index}/{instance.start}')}")
        done = _applied(allocation_id, enforcement, instances, devices)
        self.applied[allocation_id] = done
        return done

    def release(self, allocation_id: str) -> None:
        self.applied.pop(allocation_id, None)

    def in_force(self) -> list[Applied]:
        return list(self.applied.values())


class NvmlEnforcer:
    """MIG instances and MPS on real GPUs through NVML (nvidia-ml-py).

    MIG: the GPU instance profile is found by asking NVML for every profile's info and taking the
    one with the grant's compute slices and memory (so "+me" and graphics variants are not picked
    by accident); the instance is created at the grant's placement (start, size in memory slices),
    with one compute instance spanning it; its device UUID comes from the MIG device handles.
    MIG mode itself is not switched on here: that needs a GPU reset, an operator's decision.
    MPS: the control daemon is started once when a fractional grant arrives (if the binary exists);
    the per-client limits are the environment variables of the grant.
    """

    def __init__(self, nvml: Any, handles: Sequence[Any], gpus: Sequence[GpuInfo]) -> None:
        self.nvml = nvml
        self.handles = list(handles)
        self.gpus = list(gpus)
        self.applied: dict[str, Applied] = {}
        # allocation id -> (gpu instance, compute instance) handles to destroy on release
        self.instances: dict[str, list[tuple[Any, Any]]] = {}
        self.mps_started = False

    def apply(self, allocation_id: str, enforcement: Enforcement) -> Applied:
        if (done := self.applied.get(allocation_id)) is not None:
            return done
        _check_devices(enforcement, self.gpus)
        instances = _parse_instances(enforcement, self.gpus)
        created: list[tuple[Any, Any]] = []
        devices: list[str] = []
        try:
            for index, instance in instances:
                gi, ci, device = self._create(index, instance)
                created.append((gi, ci))
                devices.append(device)
        except EnforcementError:
            self._destroy(created)
            raise
        if "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in enforcement.env:
            self._ensure_mps()
        self.instances[allocation_id] = created
        done = _applied(allocation_id, enforcement, instances, devices)
        self.applied[allocation_id] = done
        return done

    def release(self, allocation_id: str) -> None:
        self._destroy(self.instances.pop(allocation_id, []))
        self.applied.pop(allocation_id, None)

    def in_force(self) -> list[Applied]:
        return list(self.applied.values())

    def _create(self, index: int, instance: mig.MigInstance) -> tuple[Any, Any, str]:
        n = self.nvml
        h = self.handles[index]
        model = self.gpus[index].model
        try:
            profile = mig.profile_of(model, instance.profile)
        except mig.MigError as e:
            raise EnforcementError(f"GPU {index}: {e}") from None
        try:
            current, _pending = n.nvmlDeviceGetMigMode(h)
            if current != n.NVML_DEVICE_MIG_ENABLE:
                raise EnforcementError(
                    f"GPU {index}: MIG mode is off; an operator enables it (nvidia-smi -i {index} -mig 1, then a reset)"
                )
            gi_info = self._gpu_instance_profile(h, profile)
            placement = n.c_nvmlGpuInstancePlacement_t()
            placement.start = instance.start
            placement.size = profile.memory_slices
            gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, gi_info.id, placement)
        except n.NVMLError as e:
            where = f"{instance.profile} at slice {instance.start}"
            raise EnforcementError(f"GPU {index}: cannot create {where}: {e}") from e
        try:
            ci_info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, _compute_profile(n, profile.compute_slices), n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
            ci = n.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
            device = self._mig_device_uuid(h, n.nvmlGpuInstanceGetInfo(gi).id)
        except n.NVMLError as e:
            self._destroy([(gi, None)])
            raise EnforcementError(f"GPU {index}: compute instance for {instance.profile}: {e}") from e
        return gi, ci, device

    def _gpu_instance_profile(self, h: Any, profile: mig.MigProfile) -> Any:
        n = self.nvml
        fits = []
        for pid in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, pid)
            except n.NVMLError:
                continue  # not supported on this GPU
            if info.sliceCount == profile.compute_slices:
                fits.append((abs(int(info.memorySizeMB) - profile.memory_mib), pid, info))
        if not fits:
            raise EnforcementError(f"NVML knows no GPU instance profile for {profile.name}")
        return min(fits, key=lambda f: (f[0], f[1]))[2]

    def _mig_device_uuid(self, h: Any, gpu_instance_id: int) -> str:
        n = self.nvml
        for i in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                mh = n.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except n.NVMLError:
                continue
            if n.nvmlDeviceGetGpuInstanceId(mh) == gpu_instance_id:
                raw = n.nvmlDeviceGetUUID(mh)
                return raw.decode() if isinstance(raw, bytes) else str(raw)
        raise EnforcementError(f"no MIG device for GPU instance {gpu_instance_id}")

    def _destroy(self, created: Sequence[tuple[Any, Any]]) -> None:
        n = self.nvml
        for gi, ci in reversed(created):
            try:
                if ci is not None:
                    n.nvmlComputeInstanceDestroy(ci)
                n.nvmlGpuInstanceDestroy(gi)
            except n.NVMLError as e:  # in use or already gone: say so, keep releasing the rest
                log.warning("MIG instance not destroyed", error=str(e))

    def _ensure_mps(self) -> None:
        if self.mps_started:
            return
        binary = shutil.which("nvidia-cuda-mps-control")
        if binary is None:
            log.warning("no nvidia-cuda-mps-control here: fractional limits rely on the HAMi-core environment only")
            self.mps_started = True
            return
        result = subprocess.run([binary, "-d"], capture_output=True, text=True, timeout=10, check=False)
        if result.returncode != 0 and "already" not in (result.stderr + result.stdout).lower():
            raise EnforcementError(f"MPS control daemon did not start: {result.stderr.strip() or result.returncode}")
        self.mps_started = True


def _compute_profile(n: Any, compute_slices: int) -> int:
    """The NVML compute instance profile spanning `compute_slices` slices."""
    by_slices = {
        1: n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2: n.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3: n.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4: n.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        7: n.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    }
    try:
        return int(by_slices[compute_slices])
    except KeyError:
        raise EnforcementError(f"no compute instance profile of {compute_slices} slices") from None
