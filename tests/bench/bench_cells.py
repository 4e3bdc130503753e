"""Cells on the Philly trace: how much longer jobs wait when the cluster is cut into k cells, each
with its own scheduler, and a router sends every job to one (docs/scale.md, "Past one control
plane"; method in libs/sim/ibpool_sim/cells_sim.py, the router in libs/core/ibpool_core/sched/cells.py).

`bench_cells.py` replays a time window of `../shared/data/traces/philly/philly.csv` (days
`--from-day` to `--to-day` counted from the trace's first submission, times rebased to the window's
first job; the cluster starts empty) on `--fabric` (default the rail-optimised 64-host fabric of
docs/benchmarks.md: 8 scalable units of 8 DGX hosts, the leaf groups) cut into k = `--cells` cells
of whole leaf groups, once per `--policy` and k. Every cell schedules with the simulator's planner
(`plan()`) and the line-up entry's policy, backfill and scan depth; k = 1 is also run through the
single pool's `simulate()` and must give the same outcomes (`k1_equals_single_pool`), or the bench
fails.

Per policy and k: queueing delay (first start - submit; a spanning gang's first start is its
commit) mean / p50 / p90 / p99, JCT mean / p50 / p99, the ratio of each to k = 1, utilisation
(GPU-seconds held / GPUs x makespan; a part holding idle hosts counts as held), the jobs the
router sent to a cell where they did not fit at arrival (`routed_waits`; of them, those the cells'
free hosts together would have held then: `routed_waits_fit_union`), the jobs that waited at all,
the gangs that spanned cells and the GPU-seconds their parts held idle waiting for the others.
Results: tests/bench/results/bench_cells-latest.json (slice, fabric, machine, time, every row and
span). Usage: .venv/bin/python tests/bench/bench_cells.py [--jobs 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
from bench_report import machine

from ibpool_sim.cells_sim import cells_summary, simulate_cells, time_window
from ibpool_sim.cluster_sim import simulate
from ibpool_sim.sched_lineup import RunOptions, config_for, select
from ibpool_sim.shared_data import locate
from ibpool_sim.traces import TraceJob, philly_trace_jobs

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULTS = HERE / "results"
PHILLY = "traces/philly/philly.csv"
DAY = 86_400.0
RATIOS = ("avg_queue_s", "p50_queue_s", "p90_queue_s", "p99_queue_s", "avg_jct_s", "p50_jct_s", "p99_jct_s")


def one(args: tuple[str, int, str, list[TraceJob]]) -> dict[str, Any]:
    """One (policy, k): the cells' summary, spans and routing; for k = 1 the single pool's check."""
    policy, k, fabric, trace = args
    config = config_for(select(policy)[0], RunOptions(fabric=fabric))
    result = simulate_cells(trace, config, k)
    row: dict[str, Any] = {"policy": policy, **cells_summary(result)}
    row["decisions"] = result.decisions
    row["per_cell"] = [
        {
            "cell": r.label.rsplit("/", 1)[-1],
            "jobs": sum(1 for o in r.outcomes if "@" not in o.id),
            "parts": sum(1 for o in r.outcomes if "@" in o.id),
            "gpus": r.total_gpus,
            "utilisation": r.summary()["utilisation"],
        }
        for r in result.per_cell
    ]
    row["spans"] = msgspec.to_builtins(result.spans)
    # Every gang's queueing delay (jobs of more than one host), to compare a spanning job with k = 1.
    row["gang_waits"] = {o.id: o.first_start_s - o.submit_s for o in result.whole.outcomes if o.hosts > 1}
    if k == 1:
        started = time.process_time()
        single = simulate(trace, config)
        row["single_pool_cpu_s"] = time.process_time() - started
        row["k1_equals_single_pool"] = msgspec.to_builtins(single.outcomes) == msgspec.to_builtins(
            result.whole.outcomes
        )
    return row


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| k | jobs | mean queue s | p50 | p90 | p99 | mean queue / k=1 | p90 / k=1 | p99 / k=1 | mean JCT s |"
        " p99 JCT s | mean JCT / k=1 | p99 JCT / k=1 | utilisation | routed where it did not fit now"
        " (of them: fit the cells' free hosts together) | waited at all | spanned | span idle GPU-h |"
    )
    out = [head, "|---:|" + "---:|" * 17]
    for r in rows:
        ratio = r["ratio_to_k1"]
        out.append(
            f"| {r['cells']} | {r['jobs']:,} | {r['avg_queue_s']:,.0f} | {r['p50_queue_s']:,.0f} |"
            f" {r['p90_queue_s']:,.0f} | {r['p99_queue_s']:,.0f} |"
            f" {_x(ratio['avg_queue_s'])} | {_x(ratio['p90_queue_s'])} | {_x(ratio['p99_queue_s'])} |"
            f" {r['avg_jct_s']:,.0f} | {r['p99_jct_s']:,.0f} | {_x(ratio['avg_jct_s'])} | {_x(ratio['p99_jct_s'])} |"
            f" {r['utilisation']:.1%} | {r['routed_waits']:,} ({r['routed_waits_fit_union']:,}) |"
            f" {r['jobs_waited']:,} | {r['spanned']} | {r['span_idle_gpu_s'] / 3600:,.1f} |"
        )
    return "\n".join(out)


def _ratio(a: float, b: float) -> float | None:
    """a / b; 1 when both are 0, None (no ratio) when only b is."""
    if b == 0:
        return 1.0 if a == 0 else None
    return a / b


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fabric", default="rail_optimised:hosts=64,su_size=8")
    parser.add_argument("--from-day", type=float, default=90.0)
    parser.add_argument("--to-day", type=float, default=109.0)
    parser.add_argument("--cells", default="1,2,4,8", help="comma list of cell counts")
    parser.add_argument("--policy", default="fifo+easy,gittins-learned", help="line-up labels (ibpool sim --policy)")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    parser.add_argument("--tag", default="", help="results file bench_cells-<tag>-latest.json (default: none)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not write the results file")
    args = parser.parse_args()
    path = locate(PHILLY)
    if path is None:
        raise SystemExit(f"shared data {PHILLY} not found (set IBPOOL_SHARED_DATA)")
    started = dt.datetime.now(dt.UTC)
    info = machine()
    whole = philly_trace_jobs(path)
    trace = time_window(whole, args.from_day * DAY, args.to_day * DAY)
    if not trace:
        raise SystemExit("the window holds no job")
    ks = [int(k) for k in args.cells.split(",")]
    policies = args.policy.split(",")
    select(args.policy)  # unknown labels fail here
    tasks = [(p, k, args.fabric, trace) for p in policies for k in ks]
    wall = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            rows = list(pool.map(one, tasks))
    else:
        rows = []
        for t in tasks:
            rows.append(one(t))
            print(f"{t[0]} k={t[1]}: {rows[-1]['cpu_s']:.1f} s CPU", file=sys.stderr)
    wall_s = time.perf_counter() - wall
    by_policy: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_policy.setdefault(r["policy"], []).append(r)
    for prows in by_policy.values():
        base = next((r for r in prows if r["cells"] == 1), prows[0])
        for r in prows:
            r["ratio_to_k1"] = {m: _ratio(float(r[m]), float(base[m])) for m in RATIOS}
    gangs = sum(1 for t in trace if t.gpus > 8)
    result: dict[str, Any] = {
        "benchmark": "bench_cells",
        "started_utc": started.isoformat(timespec="seconds"),
        "finished_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "tests/bench/bench_cells.py " + " ".join(sys.argv[1:]),
        "machine": info,
        "wall_s": wall_s,
        "slice": {
            "trace": "../shared/data/traces/philly/philly.csv",
            "from_day": args.from_day,
            "to_day": args.to_day,
            "first_job": trace[0].id,
            "last_job": trace[-1].id,
            "jobs": len(trace),
            "gangs_over_8_gpus": gangs,
            "gpus_histogram": {str(g): sum(1 for t in trace if t.gpus == g) for g in sorted({t.gpus for t in trace})},
            "offered_gpu_s": sum(t.gpus * t.duration_s for t in trace),
        },
        "fabric": args.fabric,
        "rows": rows,
        "k1_equals_single_pool": all(r.get("k1_equals_single_pool", True) for r in rows),
    }
    for policy, prows in by_policy.items():
        print(f"\n{policy}: {len(trace):,} Philly jobs (days {args.from_day:g}-{args.to_day:g}) on {args.fabric}")
        print(table(prows))
        k1: dict[str, Any] | None = next((r for r in prows if r["cells"] == 1), None)
        print("| k | gangs (jobs of > 1 host) | their mean queue s | / k=1 |")
        print("|---:|---:|---:|---:|")
        for r in prows:
            ratio = _ratio(r["avg_gang_queue_s"], k1["avg_gang_queue_s"]) if k1 else None
            print(f"| {r['cells']} | {r['gangs']:,} | {r['avg_gang_queue_s']:,.0f} | {_x(ratio)} |")
        for r in prows:
            for s in r["spans"]:
                alone = f"{k1['gang_waits'][s['id']]:,.0f} s" if k1 else "-"
                print(
                    f"  k={r['cells']} span {s['id']} ({s['gpus']} GPUs over {s['parts']}): waited"
                    f" {s['commit_s'] - s['submit_s']:,.0f} s (k=1: {alone}), parts held"
                    f" {s['idle_gpu_s'] / 3600:,.1f} GPU-h idle"
                )
    print(f"\nk=1 equals the single pool's simulate(): {result['k1_equals_single_pool']}; wall {wall_s:.0f} s")
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = RESULTS / (f"bench_cells-{args.tag}-latest.json" if args.tag else "bench_cells-latest.json")
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out.relative_to(REPO)}")
    if not result["k1_equals_single_pool"]:
        raise SystemExit("k=1 did not reproduce the single pool")


if __name__ == "__main__":
    main()
