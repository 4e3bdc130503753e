"""What the benchmarks share: the machine they ran on, runs in child processes, percentiles, and the
table every one prints (the median of its runs per measure, the floor, the verdict, each run)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def machine() -> dict[str, Any]:
    """CPU, load, Python and the commit (marked when the work tree differs), for the results file."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
    return {
        "nproc": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)),
        "cpu_model": cpu,
        "loadavg_at_start": list(os.getloadavg()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "msgspec": importlib.metadata.version("msgspec"),
        "git_commit": commit.stdout.strip() + (" (work tree modified)" if dirty.stdout.strip() else ""),
    }


def run_child(script: Path, args: list[str]) -> dict[str, Any]:
    """Run `script` with `args` in a fresh interpreter (a clean heap per run); its last stdout line is JSON."""
    proc = subprocess.run([sys.executable, str(script.resolve()), *args], capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"bench child failed: {' '.join(args)}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


Row = tuple[str, str, str | None]
"""(label, key in a run's figures, key of its floor or None)."""


def print_medians(
    rows: Sequence[Row],
    runs: Sequence[Mapping[str, Any]],
    median: Mapping[str, float],
    verdict: Mapping[str, bool],
    floors: Mapping[str, float],
    width: int = 10,
) -> None:
    print(f"{'measure':<28}{'median':>{width}}{'floor':>10}  verdict   runs")
    for label, key, floor_key in rows:
        floor = floors.get(floor_key) if floor_key else None
        mark = ("pass" if verdict[floor_key] else "FAIL") if floor_key else ""
        raw = " ".join(f"{r[key]:.3g}" for r in runs)
        print(f"{label:<28}{median[key]:>{width}.3f}{(f'< {floor:g}' if floor else ''):>10}  {mark:<8}  {raw}")
