"""`make gpu-check`: the node agent's NVML backend on this machine's real GPU, step by step.

It prints what it found and did: the driver, the inventory (UUID, model, memory, MIG mode,
NVLink), a telemetry sample, the XID event set armed and waited on, a whole GPU granted and seen
by a CUDA process as its only device, a fraction under MPS whose memory limit a CUDA process
cannot pass, and MIG instances created and destroyed for a grant (where the GPU and the
permissions allow it; it says so when not). Each step ends "ok", "FAILED: why" or "skipped: why";
the exit status is 1 when a step failed.

Where no GPU is found it runs the same steps on the NVML stand-in of the tests (FakeNvml), says
so at the top, and runs no CUDA process: that run proves only that the script works.

The CUDA processes use NVIDIA's cuda-python (driver API), installed by `make gpu-check`
(dependency group `gpu`). Nothing here is part of `make test`.

    python tests/gpu/gpu_check.py [--out FILE] [--fake]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ibpool_core.pool.enforcement import DeviceShare, enforcement_for  # noqa: E402
from ibpool_core.pool.mig import MIG_PROFILES, MigInstance  # noqa: E402
from ibpool_node_agent.backends import NvmlBackend, nvml_gpu_count  # noqa: E402
from ibpool_node_agent.enforcers import EnforcementError, NvmlEnforcer  # noqa: E402
from ibpool_node_agent.hosts import HostMetrics  # noqa: E402

# A CUDA process (driver API through cuda-python): how many devices it sees, the first one's UUID
# and name, then whether it can allocate argv[1] MiB on it. One JSON line on stdout.
CUDA_CHILD = r"""
import json, sys
try:
    from cuda.bindings import driver as cu
except ImportError:
    from cuda import cuda as cu
def ok(result, step):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        name = cu.cuGetErrorName(err)[1]
        print(json.dumps({"error": name.decode() if isinstance(name, bytes) else str(name), "step": step, **out}))
        sys.exit(0)
    return rest[0] if len(rest) == 1 else rest
out = {}
ok(cu.cuInit(0), "cuInit")
out["devices"] = ok(cu.cuDeviceGetCount(), "cuDeviceGetCount")
dev = ok(cu.cuDeviceGet(0), "cuDeviceGet")
raw = ok(cu.cuDeviceGetUuid(dev), "cuDeviceGetUuid").bytes
h = bytes(raw).hex()
out["uuid"] = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
out["name"] = ok(cu.cuDeviceGetName(64, dev), "cuDeviceGetName").split(b"\0")[0].decode()
ctx = ok(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
ptr = ok(cu.cuMemAlloc(int(sys.argv[1]) << 20), "cuMemAlloc")
out["allocated_mib"] = int(sys.argv[1])
ok(cu.cuMemFree(ptr), "cuMemFree")
print(json.dumps(out))
"""


class Report:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failed = 0

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def step(self, name: str, run: Callable[[], str]) -> None:
        """Run one step; its outcome line is `name: ok — detail`, `FAILED: why` or `skipped: why`."""
        try:
            detail = run()
        except Skipped as e:
            self.say(f"- {name}: skipped: {e}")
            return
        except (AssertionError, EnforcementError, OSError, subprocess.SubprocessError, ValueError) as e:
            self.failed += 1
            self.say(f"- {name}: FAILED: {e}")
            return
        self.say(f"- {name}: ok — {detail}")


class Skipped(Exception):
    pass


def cuda_process(env: dict[str, str], mib: int) -> dict[str, Any]:
    """Run the CUDA child with `env` over this one's; its JSON line."""
    result = subprocess.run(
        [sys.executable, "-c", CUDA_CHILD, str(mib)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [x for x in result.stdout.splitlines() if x.startswith("{")]
    if result.returncode != 0 or not lines:
        raise AssertionError(f"CUDA process exited {result.returncode}: {result.stderr.strip()[-400:]}")
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def cuda_available() -> str | None:
    """Why no CUDA process can run here, or None."""
    try:
        found = importlib.util.find_spec("cuda.bindings") or importlib.util.find_spec("cuda.cuda")
    except ModuleNotFoundError:  # no `cuda` package at all
        found = None
    if found is None:
        return "cuda-python is not installed (`make gpu-check` installs it: uv dependency group `gpu`)"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="also write the report to this file")
    p.add_argument("--fake", action="store_true", help="use the NVML stand-in even where a GPU is present")
    args = p.parse_args(argv)

    report = Report()
    real = not args.fake and nvml_gpu_count() > 0
    nvml: Any
    if real:
        import pynvml

        nvml = pynvml
    else:
        from services.node_agent.tests.fake_nvml import FakeNvml

        nvml = FakeNvml(gpus=2)
    report.say(f"# ibpool gpu-check, {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}")
    report.say()
    if not real:
        why = "--fake was given" if args.fake else "No NVIDIA GPU found here (NVML sees none)"
        report.say(
            f"**{why}: these steps ran on the NVML stand-in (FakeNvml), not on hardware, "
            "and no CUDA process ran. The real run is still owed.**"
        )
        report.say()
    backend = NvmlBackend(platform.node().split(".")[0] or "gpu-check", nvml=nvml)
    report.say(f"- host: {platform.node()}, {platform.platform()}, Python {platform.python_version()}")
    report.say(f"- driver: {nvml.nvmlSystemGetDriverVersion()}, nvidia-ml-py {_version('nvidia-ml-py')}")
    inventory = backend.inventory()
    gpus: list[dict[str, Any]] = []

    def show_inventory() -> str:
        assert inventory, "NVML lists no GPU"
        for g, h in zip(inventory, backend.handles, strict=True):
            try:
                mode = nvml.nvmlDeviceGetMigMode(h)[0]
            except nvml.NVMLError as e:
                mode = f"n/a ({e})"
            gpus.append({"gpu": g, "mig_mode": mode})
            report.say(
                f"  - GPU {g.index}: {g.model}, {g.uuid}, {g.memory_mib} MiB, MIG capable {g.mig_capable} "
                f"(mode {mode}), NVLink {'active' if g.nvlink_domain else 'none'}"
            )
        return f"{len(inventory)} GPU(s)"

    report.step("inventory", show_inventory)

    def telemetry() -> str:
        reading = backend.sample(1.0, {})
        host = HostMetrics(simulated=set()).sample(backend.node_id, {})
        for s in reading.gpus:
            report.say(
                f"  - GPU {s.index}: util {s.utilization_pct:.0f}%, memory used {s.memory_used_mib} MiB, "
                f"{s.temperature_c:.0f} C, {s.power_w:.1f} W, ECC uncorrected volatile {s.ecc_volatile} / "
                f"aggregate {s.ecc_aggregate}, retired pages or remapped rows {s.retired_pages}, "
                f"throttle {s.throttle_reasons or 'none'}"
            )
        report.say(
            f"  - host: CPU {host.cpu_pct:.0f}%, memory used {host.memory_used_mib} MiB, disk {host.disk_used_pct:.0f}%"
        )
        for f in reading.failures:
            report.say(f"  - could not read {f.kind} of GPU {f.gpu_index}: {f.error}")
        return f"{len(reading.gpus)} GPU sample(s), {len(reading.failures)} figure(s) unreadable"

    report.step("telemetry sample", telemetry)

    def xid_events() -> str:
        if not backend.watches_xids:
            raise AssertionError("the XID event set could not be armed (see the warning above)")
        started = time.monotonic()
        got = backend.watch_xids(1.0)
        waited = time.monotonic() - started
        return f"armed on {len(backend.handles)} GPU(s); one wait took {waited:.2f} s and brought {got} XID(s)"

    report.step("XID event set", xid_events)
    no_cuda = None if real else "no GPU: no CUDA process on the stand-in"
    no_cuda = no_cuda or cuda_available()
    first = inventory[0] if inventory else None

    def whole_gpu() -> str:
        assert first is not None, "no GPU"
        share = DeviceShare(index=first.index, uuid=first.uuid, milli=1000, memory_mib=first.memory_mib)
        applied = backend.enforcer.apply("gpu-check-whole", enforcement_for([share]))
        try:
            report.say(f"  - environment: CUDA_VISIBLE_DEVICES={applied.env.get('CUDA_VISIBLE_DEVICES')}")
            if no_cuda:
                raise Skipped(f"grant applied; {no_cuda}")
            seen = cuda_process(applied.env, 64)
            assert "error" not in seen, f"CUDA process: {seen}"
            assert seen["devices"] == 1, f"the CUDA process sees {seen['devices']} devices, not 1"
            assert seen["uuid"] == first.uuid, f"the CUDA process sees {seen['uuid']}, not {first.uuid}"
            return f"the CUDA process sees exactly {seen['uuid']} ({seen['name']}) and allocated 64 MiB on it"
        finally:
            backend.enforcer.release("gpu-check-whole")

    report.step("whole GPU granted, device visibility", whole_gpu)

    def fraction_under_mps() -> str:
        assert first is not None, "no GPU"
        limit = 2048
        share = DeviceShare(index=first.index, uuid=first.uuid, milli=250, memory_mib=limit)
        applied = backend.enforcer.apply("gpu-check-fraction", enforcement_for([share]))
        try:
            limits = {k: v for k, v in applied.env.items() if k.startswith("CUDA_MPS")}
            report.say(f"  - environment: {limits}")
            if no_cuda:
                raise Skipped(f"grant applied; {no_cuda}")
            if shutil.which("nvidia-cuda-mps-control") is None:
                raise AssertionError("no nvidia-cuda-mps-control on this machine: the MPS limit cannot be enforced")
            under = cuda_process(applied.env, limit // 2)
            assert "error" not in under, f"within its limit the CUDA process failed: {under}"
            over = cuda_process(applied.env, limit * 2)
            assert "error" in over, f"the CUDA process allocated {limit * 2} MiB past its {limit} MiB MPS limit"
            return (
                f"{limit // 2} MiB allocated within the {limit} MiB limit; {limit * 2} MiB refused "
                f"({over['error']} at {over['step']})"
            )
        finally:
            backend.enforcer.release("gpu-check-fraction")
            started = isinstance(backend.enforcer, NvmlEnforcer) and backend.enforcer.mps_started
            if real and started and shutil.which("nvidia-cuda-mps-control"):
                subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, timeout=30, check=False)

    report.step("fraction under MPS, memory limit", fraction_under_mps)

    def mig_instances() -> str:
        candidates = [g for g in gpus if g["gpu"].mig_capable]
        if not candidates:
            raise Skipped("no MIG-capable GPU")
        on = [g for g in candidates if g["mig_mode"] == nvml.NVML_DEVICE_MIG_ENABLE]
        if not on:
            raise Skipped("MIG mode is off (turning it on needs a GPU reset: an operator's step, not this check's)")
        gpu = on[0]["gpu"]
        profiles = MIG_PROFILES.get(gpu.model)
        if not profiles:
            raise Skipped(f"ibpool knows no MIG profiles of {gpu.model} (ibpool_core.pool.mig)")
        smallest = min(profiles.values(), key=lambda p: (p.memory_slices, p.compute_slices))
        share = DeviceShare(
            index=gpu.index,
            uuid=gpu.uuid,
            milli=1000,
            memory_mib=smallest.memory_mib,
            mig=MigInstance(profile=smallest.name, start=smallest.placements[0]),
        )
        applied = backend.enforcer.apply("gpu-check-mig", enforcement_for([share]))
        try:
            devices = applied.env.get("CUDA_VISIBLE_DEVICES", "")
            report.say(f"  - created {applied.mig_instances} as {devices}")
            assert devices.startswith("MIG-"), f"no MIG device made visible: {devices!r}"
            if not no_cuda:
                seen = cuda_process(applied.env, 64)
                assert "error" not in seen and seen["devices"] == 1, f"CUDA process on the MIG device: {seen}"
        finally:
            backend.enforcer.release("gpu-check-mig")
        left = [a for a in backend.enforcer.in_force() if a.allocation_id == "gpu-check-mig"]
        assert not left, "the MIG instance was not released"
        return f"{smallest.name} created at placement {smallest.placements[0]} and destroyed"

    report.step("MIG instances for a grant", mig_instances)
    report.say()
    report.say(f"{report.failed} step(s) failed" if report.failed else "every step that ran passed")
    if args.out:
        args.out.write_text("\n".join(report.lines) + "\n")
    return 1 if report.failed else 0


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
