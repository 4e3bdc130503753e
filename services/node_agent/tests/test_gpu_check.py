"""`make gpu-check`'s script on the NVML stand-in: it runs every step and says that no real GPU ran it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "tests" / "gpu" / "gpu_check.py"


def load_script() -> object:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_runs_on_the_stand_in_and_says_the_real_run_is_owed(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    assert load_script().main(["--fake", "--out", str(out)]) == 0  # type: ignore[attr-defined]
    text = out.read_text()
    assert "ran on the NVML stand-in" in text and "The real run is still owed" in text
    for step in ("inventory", "telemetry sample", "XID event set", "MIG instances for a grant"):
        assert f"- {step}: ok" in text, text
    # No CUDA process runs without a GPU: those steps say so rather than pass.
    assert "- whole GPU granted, device visibility: skipped: grant applied; no GPU" in text
    assert "- fraction under MPS, memory limit: skipped: grant applied; no GPU" in text
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT': '0=2048M'" in text
    assert "FAILED" not in text
