"""Enforcers: the simulated one checks MIG layouts as the hardware would; the NVML one drives NVML's MIG calls.

The NVML enforcer is exercised against `FakeNvml`, a small in-memory stand-in for the part of
nvidia-ml-py it calls (no GPU here), which refuses overlapping GPU instances as the driver does.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from ibpool_core.gpu_model import SimulatedGpus
from ibpool_node_agent.enforcers import EnforcementError, NvmlEnforcer, SimulatedEnforcer
from ibpool_proto.node import GpuInfo
from ibpool_proto.pool import Enforcement

A100 = "NVIDIA A100-SXM4-80GB"


def gpus(model: str = A100, count: int = 2) -> list[GpuInfo]:
    return SimulatedGpus(node_id="n1", seed=1, count=count, model=model).inventory()


def mig(*instances: str) -> Enforcement:
    return Enforcement(mig_instances=list(instances))


def test_simulated_mig_instances_fit_side_by_side_and_overlaps_are_refused() -> None:
    e = SimulatedEnforcer("n1", gpus())
    a = e.apply("a", mig("0:3g.40gb@0"))
    b = e.apply("b", mig("0:3g.40gb@4"))
    assert a.mig_devices != b.mig_devices and a.env["CUDA_VISIBLE_DEVICES"] == a.mig_devices[0]
    with pytest.raises(EnforcementError, match="overlaps"):
        e.apply("c", mig("0:1g.10gb@4"))
    assert {x.allocation_id for x in e.in_force()} == {"a", "b"}
    e.release("b")
    e.release("b")  # idempotent
    assert e.apply("c", mig("0:1g.10gb@4")).mig_instances == ["0:1g.10gb@4"]


@pytest.mark.parametrize(
    ("enforcement", "error"),
    [
        (mig("5:1g.10gb@0"), "GPU 5 does not exist"),
        (mig("0:9g.99gb@0"), "no MIG profile '9g.99gb'"),
        (mig("0:3g.40gb@2"), "overlaps"),  # 3g may start only at 0 or 4
        (mig("zero:1g.10gb@0"), "is not <gpu index>:<profile>@<start>"),
        (Enforcement(visible_devices=["GPU-not-here"]), "not on this node"),
    ],
)
def test_simulated_enforcer_refuses_what_hardware_would(enforcement: Enforcement, error: str) -> None:
    e = SimulatedEnforcer("n1", gpus())
    with pytest.raises(EnforcementError, match=error):
        e.apply("x", enforcement)
    assert e.in_force() == []


def test_mig_on_a_gpu_without_mig_is_refused() -> None:
    e = SimulatedEnforcer("n1", gpus(model="NVIDIA L40S"))
    with pytest.raises(EnforcementError, match="not MIG-capable"):
        e.apply("x", mig("0:1g.10gb@0"))


def test_fraction_limits_become_the_workload_environment_and_apply_is_idempotent() -> None:
    inventory = gpus()
    env = {"CUDA_VISIBLE_DEVICES": inventory[1].uuid, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}
    e = SimulatedEnforcer("n1", inventory)
    first = e.apply("f", Enforcement(env=env, visible_devices=[inventory[1].uuid], memory_limit_mib=8000))
    assert first.env == env and first.memory_limit_mib == 8000 and first.mig_devices == []
    assert e.apply("f", Enforcement()) is first


class FakeNvmlError(Exception):
    pass


class FakeNvml:
    """The NVML calls the enforcer makes, on one A100 80GB in MIG mode, keeping GPU instances in memory."""

    NVMLError = FakeNvmlError
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

    def __init__(self, mig_enabled: bool = True) -> None:
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

    def nvmlDeviceGetUUID(self, mh: int) -> bytes:
        return f"MIG-fake-{mh}".encode()

    def nvmlComputeInstanceDestroy(self, ci: int) -> None:
        del self.compute[ci]

    def nvmlGpuInstanceDestroy(self, gi: int) -> None:
        del self.instances[gi]


def test_nvml_creates_the_granted_instance_at_its_placement_and_destroys_it_on_release() -> None:
    nvml = FakeNvml()
    e = NvmlEnforcer(nvml, ["h0"], gpus(count=1))
    a = e.apply("a", mig("0:3g.40gb@4"))
    assert nvml.instances == {1: (2, 4, 4)}
    assert a.mig_devices == ["MIG-fake-1"] and a.env["CUDA_VISIBLE_DEVICES"] == "MIG-fake-1"
    b = e.apply("b", mig("0:1g.20gb@0"))  # 1 compute slice, 2 memory slices: the 1g.20gb profile, not 1g.10gb
    assert nvml.instances[2] == (9, 0, 2) and b.mig_devices == ["MIG-fake-2"]
    with pytest.raises(EnforcementError, match=r"cannot create 1g\.10gb at slice 5"):
        e.apply("c", mig("0:1g.10gb@5"))
    e.release("a")
    assert set(nvml.instances) == {2} and set(nvml.compute.values()) == {2}


def test_nvml_leaves_nothing_behind_when_a_step_fails() -> None:
    nvml = FakeNvml()
    nvml.fail_compute = True
    e = NvmlEnforcer(nvml, ["h0"], gpus(count=1))
    with pytest.raises(EnforcementError, match="compute instance"):
        e.apply("a", mig("0:3g.40gb@0"))
    assert nvml.instances == {} and e.in_force() == []


def test_nvml_refuses_mig_when_mig_mode_is_off() -> None:
    e = NvmlEnforcer(FakeNvml(mig_enabled=False), ["h0"], gpus(count=1))
    with pytest.raises(EnforcementError, match="MIG mode is off"):
        e.apply("a", mig("0:1g.10gb@0"))
