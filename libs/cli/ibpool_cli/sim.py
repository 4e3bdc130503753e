"""`ibpool sim`: replay a job trace through the scheduler core under every policy and compare them.

    ibpool sim --trace philly --nodes 80 --policy all [--limit N] [--failures K --seed N]
               [--placement leaf|framework [--sharp-leaves SHARE]]
    ibpool sim --trace philly --fabric SPEC|FILE [--sharp-per link|switch] --policy all
    ibpool sim --trace philly --fabric SPEC --policy all --halves
    ibpool sim --trace philly --nodes 80 --limit 10000 --two-sites [--exact-runtimes]
               [--plot FILE.png] [--format table|json] [--jobs P]

`--trace` is `philly` (../shared/data/traces/philly/philly.csv) or the path of a generic CSV
(traces.load_generic_jobs). `--fabric` runs on a real fabric: a generator spec
(`fat_tree_2tier:hosts=64,radix=12,oversubscription=2,sharp=true`, `rail_optimised:hosts=64,su_size=8`)
or a topology file in any format `ibpool topo convert` reads; its hosts are the cluster, placement
is the scheduler's framework on it, SHARP trees are bounded (`--sharp-per`). `--halves` cuts the
trace in two in time order, chooses `gittins-learned`'s thresholds on the first half
(ibpool_sim.halves) and reports the second. The run is deterministic; `--seed` only chooses the
`--failures` injected host failures. Exit codes: 0 ok, 1 usage error, 2 input error (unreadable
trace or fabric).
Method, cost model and results: docs/scheduling.md, docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ibpool_core.fabric.model import FabricError
from ibpool_core.sched.sharp import SharpLimits
from ibpool_sim.cluster_sim import SimConfig, SimFabric, SimResult, load_fabric
from ibpool_sim.halves import CANDIDATES, Trial, report_entries, split, tune
from ibpool_sim.sched_lineup import LineupEntry, RunOptions, check_floors, random_failures, run_entry, select
from ibpool_sim.shared_data import locate
from ibpool_sim.sites_sim import STRATEGIES, TwoSiteConfig, simulate_two_sites
from ibpool_sim.traces import TraceError, TraceJob, load_generic_jobs, philly_trace_jobs

PHILLY = "traces/philly/philly.csv"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ibpool sim", description="compare scheduling policies on a job trace")
    p.add_argument("--trace", default="philly", help="`philly` or a generic CSV path")
    p.add_argument("--nodes", type=int, default=80, help="hosts of 8 GPUs, 8 hosts per leaf (default 80)")
    p.add_argument("--policy", default="all", help="`all` or a comma list of policy labels")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N jobs (in submit order)")
    p.add_argument("--failures", type=int, default=0, help="inject this many random host failures (1 h each)")
    p.add_argument("--seed", type=int, default=0, help="chooses the injected failures")
    p.add_argument("--plot", type=Path, default=None, help="write JCT CDF plots to this PNG")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--jobs", type=int, default=1, help="policies simulated in parallel processes")
    p.add_argument(
        "--span-relax-h",
        type=float,
        default=None,
        help="a gang that waited this many hours may span more leaves than its minimum (default: never)",
    )
    p.add_argument(
        "--two-sites",
        action="store_true",
        help="split --nodes into two sites and compare routing jobs that name both (first, most-free, choose)",
    )
    p.add_argument(
        "--halves",
        action="store_true",
        help="choose gittins-learned's thresholds on the trace's first half, report the line-up on the second",
    )
    p.add_argument(
        "--exact-runtimes",
        action="store_true",
        help="with --two-sites: runtimes known at submit instead of the online median predictor",
    )
    p.add_argument(
        "--placement",
        choices=["leaf", "framework"],
        default="leaf",
        help="leaf: the core's best-fit leaf placer; framework: the scheduler service's plugin profile",
    )
    p.add_argument(
        "--fabric",
        default=None,
        help="a real fabric: generator spec or topology file (its hosts replace --nodes; framework placement)",
    )
    p.add_argument(
        "--sharp-per",
        choices=["link", "switch"],
        default="link",
        help="with --fabric: SHARP trees bounded per cable (Quantum-2) or per switch (Quantum HDR)",
    )
    p.add_argument(
        "--sharp-leaves",
        type=float,
        default=0.0,
        help="share of the leaf switches that can aggregate (SHARP), 0..1; framework placement only",
    )
    return p


def load_trace(name: str, limit: int | None) -> list[TraceJob]:
    if name == "philly":
        path = locate(PHILLY)
        if path is None:
            raise FileNotFoundError(f"shared data {PHILLY} not found (set IBPOOL_SHARED_DATA)")
        return philly_trace_jobs(path, limit)
    return load_generic_jobs(Path(name), limit)


def _one(args: tuple[LineupEntry, list[TraceJob], RunOptions]) -> SimResult:
    entry, trace, options = args
    return run_entry(entry, trace, options)


def run_all(
    entries: Sequence[LineupEntry], trace: list[TraceJob], options: RunOptions, jobs: int, quiet: bool
) -> list[SimResult]:
    console = Console(stderr=True)
    columns = (
        TextColumn("{task.description:<12}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, disable=quiet, transient=False) as bar:
        tasks = {e.label: bar.add_task(e.label, total=1.0) for e in entries}
        if jobs <= 1:
            results = []
            for e in entries:

                def advance(fraction: float, task: Any = tasks[e.label]) -> None:
                    bar.update(task, completed=fraction)

                results.append(run_entry(e, trace, options, progress=advance))
            return results
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(_one, (e, trace, options)) for e in entries]
            results = []
            for e, f in zip(entries, futures, strict=True):
                results.append(f.result())
                bar.update(tasks[e.label], completed=1.0)
            return results


def _hours(seconds: float) -> str:
    return f"{seconds:,.0f}"


def format_table(summaries: list[dict[str, Any]], floors: list[Any], tiers: bool = False) -> str:
    """The markdown table; `tiers`: a column for the share of gangs at the lowest tier the fabric allows."""
    head = (
        "| policy | avg JCT s | median JCT s | p99 JCT s | avg queueing s | utilisation | makespan d |"
        " preemptions | min leaf span |" + (" min tier |" if tiers else "") + " SHARP | CPU s | wall s |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if tiers else "") + "---:|---:|---:|"]
    for s in summaries:
        tier = f" {s['min_tier_share']:.1%} |" if tiers else ""
        lines.append(
            f"| {s['policy']} | {_hours(s['avg_jct_s'])} | {_hours(s['median_jct_s'])} | {_hours(s['p99_jct_s'])} |"
            f" {_hours(s['avg_queue_s'])} | {s['utilisation']:.1%} | {s['makespan_s'] / 86400:.1f} |"
            f" {s['preemptions']} | {s['min_span_share']:.1%} |{tier} {s['sharp_share']:.1%} | {s['cpu_s']:.1f} |"
            f" {s['wall_s']:.1f} |"
        )
    for f in floors:
        verdict = "holds" if f.holds else "DOES NOT hold"
        op = ">=" if "span" in f.name else "<="
        lines.append(f"floor: {f.name} = {f.value:.3f} ({op} {f.limit}): {verdict}")
    return "\n".join(lines)


def plot_cdf(results: list[SimResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        jct = sorted(max(1.0, o.end_s - o.submit_s) for o in r.outcomes)
        n = len(jct)
        ax.plot(jct, [(i + 1) / n for i in range(n)], label=r.label, linewidth=1.2)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("share of jobs")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def two_sites(trace: list[TraceJob], args: argparse.Namespace) -> int:
    """`--two-sites`: every routing strategy of `ibpool_sim.sites_sim` on the trace, one table."""
    half = args.nodes // 2
    config = TwoSiteConfig(nodes=(args.nodes - half, half), seed=args.seed, exact_runtimes=args.exact_runtimes)
    try:
        results = [simulate_two_sites(trace, s, config) for s in STRATEGIES]
    except ValueError as e:
        print(f"ibpool sim: {e}", file=sys.stderr)
        return 2
    if args.format == "json":
        out = {"trace": args.trace, "jobs": len(trace), "config": msgspec.to_builtins(config)}
        print(json.dumps({**out, "strategies": msgspec.to_builtins(results)}, indent=2))
        return 0
    runtimes = "exact runtimes" if args.exact_runtimes else "predicted runtimes"
    print(
        f"{args.trace}: {len(trace)} jobs naming sites [a, b] ({config.nodes[0]} and {config.nodes[1]} nodes x 8 GPUs),"
        f" {config.reads_share:.0%} reading a dataset held at a ({config.transfer_s:.0f} s to copy), {runtimes}"
    )
    print("| routing | avg JCT s | median JCT s | avg queueing s | jobs at a / b | dataset copies |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r.strategy} | {_hours(r.avg_jct_s)} | {_hours(r.median_jct_s)} | {_hours(r.avg_queue_s)} |"
            f" {r.placed['a']} / {r.placed['b']} | {r.copies} |"
        )
    return 0


def main(argv: Sequence[str]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as e:
        return 0 if e.code == 0 else 1
    try:
        entries = select(args.policy)
    except ValueError as e:
        print(f"ibpool sim: {e}", file=sys.stderr)
        return 1
    if args.nodes < 1:
        print("ibpool sim: --nodes must be >= 1", file=sys.stderr)
        return 1
    if not 0.0 <= args.sharp_leaves <= 1.0 or (args.sharp_leaves and args.placement != "framework"):
        print("ibpool sim: --sharp-leaves must be within 0..1 and goes with --placement framework", file=sys.stderr)
        return 1
    try:
        trace = load_trace(args.trace, args.limit)
    except (OSError, TraceError) as e:
        print(f"ibpool sim: {e}", file=sys.stderr)
        return 2
    if args.two_sites:
        return two_sites(trace, args)
    if args.fabric is not None:
        try:
            fabric = SimFabric(load_fabric(args.fabric), SimConfig())
        except (ValueError, FabricError) as e:
            print(f"ibpool sim: --fabric: {e}", file=sys.stderr)
            return 2
        args.nodes, args.placement = len(fabric.names), "framework"
        hosts_per_leaf = fabric.hosts_per_leaf
    else:
        hosts_per_leaf = 8
    horizon = max((t.submit_s for t in trace), default=0.0)
    failures = random_failures(args.seed, args.failures, args.nodes, horizon) if args.failures else []
    options = RunOptions(
        nodes=args.nodes,
        failures=tuple(failures),
        span_relax_s=math.inf if args.span_relax_h is None else args.span_relax_h * 3600.0,
        placement=args.placement,
        sharp_leaf_share=args.sharp_leaves,
        fabric=args.fabric,
        sharp_limits=SharpLimits(per=args.sharp_per),
    )
    quiet = args.format == "json"
    trials: list[Trial] = []
    chosen = None
    try:
        if args.halves:
            first, trace = split(trace)

            def on_first(tried: list[LineupEntry]) -> list[float]:
                return [float(r.summary()["avg_jct_s"]) for r in run_all(tried, first, options, args.jobs, quiet)]

            chosen, trials = tune(CANDIDATES, first, on_first)
            entries = report_entries(entries, chosen, first)
        results = run_all(entries, trace, options, args.jobs, quiet)
    except ValueError as e:
        print(f"ibpool sim: {e}", file=sys.stderr)
        return 2
    summaries = [r.summary() for r in results]
    floors = check_floors(summaries, args.nodes)
    if args.format == "json":
        out = {
            "trace": args.trace,
            "jobs": len(trace),
            "nodes": args.nodes,
            "gpus_per_node": 8,
            "hosts_per_leaf": hosts_per_leaf,
            "fabric": args.fabric,
            "sharp_per": args.sharp_per if args.fabric else None,
            "failures": len(failures),
            "span_relax_h": args.span_relax_h,
            "placement": args.placement,
            "sharp_leaves": args.sharp_leaves,
            "seed": args.seed,
            "halves": args.halves,
            "tuned_on_first_half": [
                {"thresholds": t.thresholds.name, "thresholds_s": t.thresholds.seconds, "avg_jct_s": t.avg_jct_s}
                for t in trials
            ],
            "policies": summaries,
            "floors": [{"name": f.name, "value": f.value, "limit": f.limit, "holds": f.holds} for f in floors],
        }
        print(json.dumps(out, indent=2))
    else:
        sharp = f", SHARP on {args.sharp_leaves:.0%} of the leaves" if args.sharp_leaves else ""
        where = (
            f"the fabric {args.fabric} (leaf groups of up to {hosts_per_leaf}; SHARP trees per {args.sharp_per})"
            if args.fabric
            else f"{args.nodes} nodes x 8 GPUs (8 nodes per leaf)"
        )
        if trials:
            print("gittins-learned's thresholds, tried on the first half of the trace (avg JCT s):")
            for t in trials:
                mark = "  <- chosen" if t.thresholds == chosen else ""
                print(f"  {t.thresholds.name:<22} {t.avg_jct_s:>12,.0f}{mark}")
        half = "the second half of " if args.halves else ""
        print(f"{half}{args.trace}: {len(trace)} jobs on {where}, {args.placement} placement{sharp}")
        print(format_table(summaries, floors, tiers=args.fabric is not None))
    if args.plot is not None:
        plot_cdf(results, args.plot, f"JCT CDF, {args.trace} ({len(trace)} jobs), {args.nodes} nodes x 8 GPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
