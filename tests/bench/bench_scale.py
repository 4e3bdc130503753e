"""The cost curve of the whole system: `ibpool run --measure` at several cluster sizes.

Each size runs the full scenario of `ibpool run` (every service its own process on the embedded
stack, one agent process hosting the simulated 8-GPU nodes plus the spare that is SIGKILLed and
restarted, a generated rail-optimised fabric of that many hosts polled by the fabric monitor,
heartbeats and telemetry at the default intervals, the mixed workload: whole GPUs, fractions, gangs,
an inference deployment under load, an elastic job, two injected link faults) for `--duration`
seconds, and keeps what `--measure` wrote: CPU seconds and peak RSS per process, events per
second by type, stream and Postgres growth, the scheduler's cycle, JobQueued -> JobScheduled, and the
spare's SIGKILL -> NodeFailed. A size whose run does not finish in time, or fails, is recorded as
such, with its log's tail: that is where the machine ran out.

Results: tests/bench/results/bench_scale-latest.json; `--table` prints the markdown of docs/scale.md,
`--plot FILE` draws CPU per 1,000 nodes against size.
Usage: .venv/bin/python tests/bench/bench_scale.py --sizes 10,100,1000 --duration 90 --table --plot docs/scale-cpu.png
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SERVICES = ("node_agent", "fabric_monitor", "pool_allocator", "scheduler", "failover_controller", "autoscaler")
SERVERS = ("nats-server", "postgres")


def run_size(nodes: int, duration: float, timeout_s: float) -> dict[str, Any]:
    """One `ibpool run --nodes NODES --measure` in a throw-away state dir."""
    state = Path(tempfile.mkdtemp(prefix=f"ibpool-scale-{nodes}-"))
    out = state / "measured.json"
    cmd = [
        sys.executable,
        "-m",
        "ibpool_cli",
        "run",
        "--nodes",
        str(nodes),
        "--duration",
        str(duration),
        "--state-dir",
        str(state / "run"),
        "--measure",
        str(out),
    ]
    started = time.monotonic()
    log = state / "run.log"
    try:
        with log.open("wb") as f:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        rc = None
    took = round(time.monotonic() - started, 1)
    try:
        if out.exists():
            text = log.read_text(errors="replace")
            return {
                "nodes_asked": nodes,
                "rc": rc,
                "wall_s": took,
                "measured": json.loads(out.read_text()),
                "failed_checks": failed_checks(text),
            }
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        return {"nodes_asked": nodes, "rc": rc, "wall_s": took, "measured": None, "log_tail": tail}
    finally:
        shutil.rmtree(state, ignore_errors=True)


def failed_checks(log: str) -> list[str]:
    """The first line of every check the run's summary table marks NO."""
    summary = log.split("ibpool run: summary", 1)[-1]
    return [line.split("│")[1].strip() for line in summary.splitlines() if line.rstrip().endswith("│ NO  │")]


def _cores(m: dict[str, Any], name: str) -> float:
    p = m["processes"].get(name)
    return p["steady_cpu_s"] / m["steady_s"] if p and m["steady_s"] > 0 else 0.0


def table(results: list[dict[str, Any]]) -> str:
    """The markdown tables of docs/scale.md: cores used (steady) and peak RSS per process, then the rest."""
    names = [*SERVICES, "node_agent_spare", *SERVERS]
    rows = ["| nodes (GPUs) | " + " | ".join(names) + " | all |", "|---|" + "---|" * (len(names) + 1)]
    mem = ["| nodes | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    other = [
        "| nodes | events/s | heartbeats/s | stream MB/h | Postgres rows at the end (growth/h) "
        "| Postgres MB at the end (growth/h) | cycle p50 / p99 (bucket) | queued -> scheduled p50 / p99 "
        "| SIGKILL -> failed | summary |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r["measured"]
        if m is None:
            why = "timed out" if r["rc"] is None else f"exit {r['rc']}"
            rows.append(f"| {r['nodes_asked'] + 1} | no result: {why} after {r['wall_s']} s |")
            continue
        cores = [_cores(m, n) for n in names]
        rows.append(
            f"| {m['nodes']:,} ({m['gpus']:,}) | " + " | ".join(f"{c:.2f}" for c in cores) + f" | {sum(cores):.2f} |"
        )
        mem.append(
            f"| {m['nodes']:,} | "
            + " | ".join(f"{m['processes'].get(n, {}).get('peak_rss_mib', 0):.0f}" for n in names)
            + " |"
        )
        hour = 3600.0 / m["steady_s"] if m["steady_s"] > 0 else 0.0
        streams = sum(end - start for start, end in m["stream_bytes"].values())
        pg_rows = sum(end["rows"] - start["rows"] for start, end in m["postgres"].values())
        pg_bytes = sum(end["bytes"] - start["bytes"] for start, end in m["postgres"].values())
        pg_rows_end = sum(end["rows"] for _, end in m["postgres"].values())
        pg_bytes_end = sum(end["bytes"] for _, end in m["postgres"].values())
        failed = r.get("failed_checks") or []
        events = sum(m["events_per_s"].values())
        beats = m["events_per_s"].get("io.ibpool.node.heartbeat.sent.v1", 0.0)

        def s(v: float | None) -> str:
            return "-" if v is None else f"{v:g} s"

        other.append(
            f"| {m['nodes']:,} | {events:,.0f} | {beats:,.0f} | {streams * hour / 2**20:,.0f} "
            f"| {pg_rows_end:,} ({pg_rows * hour:,.0f}) | {pg_bytes_end / 2**20:,.0f} ({pg_bytes * hour / 2**20:,.0f}) "
            f"| {s(m['cycle_p50_s'])} / {s(m['cycle_p99_s'])} "
            f"| {s(m['queued_to_scheduled_p50_s'])} / {s(m['queued_to_scheduled_p99_s'])} "
            f"| {s(m['kill_to_failed_s'])} | {'yes' if m['summary_ok'] else 'NO: ' + '; '.join(failed)} |"
        )
    return (
        "CPU cores used in the steady part (CPU seconds / seconds):\n\n"
        + "\n".join(rows)
        + "\n\nPeak resident memory (MiB):\n\n"
        + "\n".join(mem)
        + "\n\nThe rest:\n\n"
        + "\n".join(other)
        + "\n"
    )


def plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r["measured"] for r in results if r["measured"] is not None]
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in (*SERVICES, *SERVERS):
        xs = [m["nodes"] for m in done]
        ys = [_cores(m, name) / m["nodes"] * 1000 for m in done]
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes (8 GPUs each)")
    ax.set_ylabel("CPU cores per 1,000 nodes (steady)")
    ax.set_title("ibpool: cost per node against cluster size (2-core machine)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--sizes", default="10,100,1000,5000,12500", help="nodes per run, comma-separated")
    p.add_argument("--duration", type=float, default=90.0, help="seconds of the scenario at each size")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one size may take in all")
    p.add_argument("--table", action="store_true", help="print the markdown tables")
    p.add_argument("--plot", metavar="FILE", help="draw CPU per 1,000 nodes against size")
    p.add_argument("--out", default=str(RESULTS / "bench_scale-latest.json"))
    args = p.parse_args()
    results = []
    for size in (int(x) for x in args.sizes.split(",")):
        r = run_size(size, args.duration, args.timeout)
        m = r["measured"]
        print(f"{size} nodes: rc {r['rc']}, {r['wall_s']} s" + ("" if m else " (no measurement)"), flush=True)
        results.append(r)
    doc = {
        "duration_s": args.duration,
        "results": results,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_1m": os.getloadavg()[0]},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    if args.table:
        print(table(results))
    if args.plot:
        plot(results, args.plot)
    return 0 if all(r["measured"] is not None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
