"""Enforcers: the simulated one checks MIG layouts as the hardware would; the NVML one drives NVML's MIG calls.

The NVML enforcer is exercised against `FakeNvml` (fake_nvml.py: no GPU here), which refuses
overlapping GPU instances as the driver does.
"""

from __future__ import annotations

import pytest

from ibpool_core.gpu_model import SimulatedGpus
from ibpool_node_agent.enforcers import EnforcementError, NvmlEnforcer, SimulatedEnforcer
from ibpool_proto.node import GpuInfo
from ibpool_proto.pool import Enforcement
from services.node_agent.tests.fake_nvml import FakeNvml

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
