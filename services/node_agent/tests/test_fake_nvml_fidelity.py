"""The NVML stand-in against nvidia-ml-py itself: the same functions, signatures, constants and structures.

The backend and the enforcers are tested through `FakeNvml`; this is what makes those tests say
something about a real GPU. Every NVML function the fake offers must exist in pynvml and take the
arguments pynvml's takes; every constant must have pynvml's value; what it returns must carry the
fields of pynvml's ctypes structure (or be one); and every NVML name the node agent's code uses
must be in the fake, so no call goes untested.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pynvml
import pytest

from services.node_agent.tests.fake_nvml import FakeGpu, FakeNvml

PACKAGE = Path(__file__).resolve().parents[1] / "ibpool_node_agent"


def fake_functions() -> list[str]:
    return sorted(name for name, v in vars(FakeNvml).items() if name.startswith("nvml") and callable(v))


def fake_constants() -> list[str]:
    return sorted(
        name
        for name, v in vars(FakeNvml).items()
        if (name.startswith("NVML_") or name.startswith("nvmlEventType")) and not callable(v)
    )


@pytest.mark.parametrize("name", fake_functions())
def test_every_fake_function_has_pynvmls_signature(name: str) -> None:
    assert hasattr(pynvml, name), f"pynvml has no {name}"
    real = inspect.signature(getattr(pynvml, name)).parameters
    fake = list(inspect.signature(getattr(FakeNvml, name)).parameters.values())[1:]  # without self
    assert [p.name for p in fake] == list(real), f"{name}: fake takes {[p.name for p in fake]}, pynvml {list(real)}"
    for p in fake:
        has_default = real[p.name].default is not inspect.Parameter.empty
        assert (p.default is not inspect.Parameter.empty) == has_default, f"{name}({p.name}): default differs"


@pytest.mark.parametrize("name", fake_constants())
def test_every_fake_constant_has_pynvmls_value(name: str) -> None:
    assert getattr(FakeNvml, name) == getattr(pynvml, name)


def test_the_error_is_pynvmls_and_maps_codes_to_its_subclasses() -> None:
    assert FakeNvml.NVMLError is pynvml.NVMLError
    nvml = FakeNvml(events_supported=False)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlEventSetCreate()


def test_what_the_fake_returns_has_the_fields_of_pynvmls_structures() -> None:
    nvml, gpu = FakeNvml(), FakeGpu(0)
    structures = {
        "nvmlDeviceGetMemoryInfo": (nvml.nvmlDeviceGetMemoryInfo(gpu), pynvml.c_nvmlMemory_t),
        "nvmlDeviceGetUtilizationRates": (nvml.nvmlDeviceGetUtilizationRates(gpu), pynvml.c_nvmlUtilization_t),
        "nvmlDeviceGetGpuInstanceProfileInfo": (
            nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, 0),
            pynvml.c_nvmlGpuInstanceProfileInfo_v2_t,
        ),
        "nvmlGpuInstanceGetInfo": (nvml.nvmlGpuInstanceGetInfo(1), pynvml.c_nvmlGpuInstanceInfo_t),
        "nvmlDeviceGetPciInfo": (nvml.nvmlDeviceGetPciInfo(gpu), pynvml.nvmlPciInfo_t),
    }
    for name, (value, struct) in structures.items():
        assert isinstance(value, struct), f"{name} returns {type(value).__name__}, pynvml {struct.__name__}"
    nvml.raise_xid(0, 79)
    event = nvml.nvmlEventSetWait_v2("event-set", 0)
    assert sorted(vars(event)) == sorted(f for f, _ in pynvml.c_nvmlEventData_t._fields_)
    # pynvml decodes C strings (convertStrBytes) and returns MIG mode as a [current, pending] list
    assert isinstance(nvml.nvmlDeviceGetUUID(gpu), str) and isinstance(nvml.nvmlDeviceGetName(gpu), str)
    assert isinstance(nvml.nvmlDeviceGetMigMode(gpu), list)


def nvml_names_used_by_the_agent() -> set[str]:
    """Every attribute the agent's code reads off its `nvml` module (`n.X` or `nvml.X` or `self.nvml.X`)."""
    used: set[str] = set()
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and (node.attr.startswith(("nvml", "NVML", "c_nvml"))):
                base = node.value
                if (isinstance(base, ast.Name) and base.id in {"n", "nvml"}) or (
                    isinstance(base, ast.Attribute) and base.attr == "nvml"
                ):
                    used.add(node.attr)
    return used


def test_every_nvml_name_the_agent_uses_is_in_pynvml_and_in_the_fake() -> None:
    used = nvml_names_used_by_the_agent()
    assert {"nvmlEventSetWait_v2", "nvmlDeviceGetTemperature", "nvmlDeviceCreateGpuInstanceWithPlacement"} <= used
    assert sorted(u for u in used if not hasattr(pynvml, u)) == []
    assert sorted(u for u in used if not hasattr(FakeNvml, u)) == []
