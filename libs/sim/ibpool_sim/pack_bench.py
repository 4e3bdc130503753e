"""`ibpool bench pack`: the FGD paper's packing experiment on the Alibaba PAI openb traces.

For a pod list and a node list: take the GPU pods (num_gpu > 0), sample them with replacement
(seeded) into an arrival stream until the GPU they ask (num_gpu x gpu_milli / 1000, summed over
the arrived pods) reaches 130% of the cluster's GPUs; no pod ever leaves. Each pod is placed on
arrival by the policy or rejected (it fits nowhere: GPU, gpu_spec model, CPU and memory are all
respected). Every policy runs on the same streams.

Figures per run: the unallocated GPU share (1 - allocated GPU / capacity) at the first arrival that
brings the arrived demand to 100% of capacity, the pods rejected up to then (count and GPU), the
same at the end of the stream (130%), and the curve of allocated share vs arrived demand.

    python -m ibpool_sim.pack_bench --pods FILE[,FILE] --nodes FILE --policy NAME[,NAME] \
        --seeds N --format json|table [--plot PNG] [--out JSON] [--jobs N]

Without --pods / --nodes it uses the three openb pod lists (default, gpushare100, multigpu50) and
the openb GPU node list from the shared data folder (`shared_data`).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from ibpool_core.pool.packing import WHOLE, NodeSpec, Packer, PackingCluster, PackRequest, ScorePlugin
from ibpool_core.pool.policies import POLICIES, FgdPlus, make_policy
from ibpool_sim import shared_data
from ibpool_sim.traces import TraceError, load_openb_nodes

OPENB = "traces/alibaba-openb"
DEFAULT_PODS = ("openb_pod_list_default.csv", "openb_pod_list_gpushare100.csv", "openb_pod_list_multigpu50.csv")
DEFAULT_NODES = "openb_node_list_gpu_node.csv"
DEFAULT_POLICIES = ("first-fit", "best-fit", "worst-fit", "dot-product", "fgd", "fgd+")
# fgd+ with one extension off, to measure what each brings (bench-only names, not in the registry)
ABLATIONS: dict[str, Callable[[], ScorePlugin]] = {
    "fgd+/no-host": lambda: FgdPlus(host_weight=0.0),
    "fgd+/host-only": lambda: FgdPlus(host_weight=1.0),
    "fgd+/no-memory": lambda: FgdPlus(memory_aware=False),
    "fgd+/no-tie-break": lambda: FgdPlus(tie_break=False),
}
STOP_AT = 1.30  # arrived demand / capacity at which a stream ends
CURVE_STEP = 0.01  # the curve is sampled every 1% of arrived demand


class PodRow(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    request: PackRequest


def load_pods(path: Path) -> list[PodRow]:
    """An openb pod list as packing requests. Accepts the full header (`traces.load_openb_pods`'s)
    and the short one of the resampled lists (name,cpu_milli,memory_mib,num_gpu,gpu_milli), where
    `gpu_spec` is absent (any model). A bad row raises TraceError naming file and line."""
    need = ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"]
    out = []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames or []
        if fields[: len(need)] != need:
            raise TraceError(f"{path}: header is {fields}, expected it to start with {need}")
        for row in reader:
            try:
                num = int(row["num_gpu"])
                milli = int(row["gpu_milli"])
                out.append(
                    PodRow(
                        name=row["name"],
                        request=PackRequest(
                            cpu_milli=int(row["cpu_milli"]),
                            memory_mib=int(row["memory_mib"]),
                            num_gpu=num,
                            gpu_milli=milli if num else WHOLE,
                            gpu_models=PackRequest.models_from_spec(row.get("gpu_spec") or ""),
                        ),
                    )
                )
            except (ValueError, TypeError) as e:
                raise TraceError(f"{path}:{reader.line_num}: {type(e).__name__}: {e}") from None
    return out


def load_nodes(path: Path) -> list[NodeSpec]:
    return [
        NodeSpec(name=n.name, cpu_milli=n.cpu_milli, memory_mib=n.memory_mib, gpu_model=n.gpu_model, gpus=n.gpus)
        for n in load_openb_nodes(path)
    ]


def arrival_stream(pods: Sequence[PackRequest], capacity_milli: int, seed: int, stop_at: float = STOP_AT) -> list[int]:
    """Indices into `pods` (GPU pods), sampled with replacement until the arrived GPU demand
    reaches `stop_at` x capacity (the arrival that crosses it is the last)."""
    if not pods or capacity_milli <= 0:
        return []
    rng = random.Random(seed)
    out: list[int] = []
    arrived = 0
    limit = stop_at * capacity_milli
    while arrived < limit:
        i = rng.randrange(len(pods))
        out.append(i)
        arrived += pods[i].gpu_demand_milli
    return out


class RunResult(msgspec.Struct, kw_only=True):
    pods: str
    policy: str
    seed: int
    arrivals: int
    arrivals_at_100: int
    unallocated_at_100: float
    rejected_at_100: int
    rejected_gpu_at_100: float
    rejected_multi_at_100: int  # pods of 2+ GPUs rejected up to 100%
    first_multi_reject: float | None  # arrived demand / capacity when the first 2+ GPU pod was rejected
    unallocated_end: float
    rejected_end: int
    rejected_gpu_end: float
    seconds: float
    curve: list[tuple[float, float]]  # (arrived demand / capacity, allocated / capacity)


def run_one(
    nodes: Sequence[NodeSpec], pods: Sequence[PackRequest], stream: Sequence[int], policy: str, *, label: str, seed: int
) -> RunResult:
    cluster = PackingCluster(nodes)
    packer = Packer(cluster, ABLATIONS[policy]() if policy in ABLATIONS else make_policy(policy))
    cap = cluster.capacity_milli
    arrived = 0
    rejected = rejected_milli = rejected_multi = 0
    first_multi: float | None = None
    at100: tuple[int, float, int, int, int] | None = None
    curve: list[tuple[float, float]] = [(0.0, 0.0)]
    next_mark = CURVE_STEP
    t0 = time.perf_counter()
    for k, i in enumerate(stream, 1):
        req = pods[i]
        arrived += req.gpu_demand_milli
        if packer.place(req) is None:
            rejected += 1
            rejected_milli += req.gpu_demand_milli
            if req.num_gpu > 1:
                rejected_multi += 1
                if first_multi is None:
                    first_multi = round(arrived / cap, 4)
        share = arrived / cap
        if at100 is None and arrived >= cap:
            at100 = (k, 1 - cluster.allocated_milli / cap, rejected, rejected_milli, rejected_multi)
        if share >= next_mark:
            curve.append((round(share, 4), round(cluster.allocated_milli / cap, 5)))
            next_mark = (int(share / CURVE_STEP + 1e-9) + 1) * CURVE_STEP
    seconds = time.perf_counter() - t0
    if at100 is None:
        at100 = (len(stream), 1 - cluster.allocated_milli / cap, rejected, rejected_milli, rejected_multi)
    return RunResult(
        pods=label,
        policy=policy,
        seed=seed,
        arrivals=len(stream),
        arrivals_at_100=at100[0],
        unallocated_at_100=at100[1],
        rejected_at_100=at100[2],
        rejected_gpu_at_100=at100[3] / WHOLE,
        rejected_multi_at_100=at100[4],
        first_multi_reject=first_multi,
        unallocated_end=1 - cluster.allocated_milli / cap,
        rejected_end=rejected,
        rejected_gpu_end=rejected_milli / WHOLE,
        seconds=round(seconds, 3),
        curve=curve,
    )


def pod_label(path: Path) -> str:
    stem = path.stem
    return stem.removeprefix("openb_pod_list_")


_CACHE: dict[str, Any] = {}


def _job(args: tuple[str, str, int, str]) -> RunResult:
    pods_file, nodes_file, seed, policy = args
    key = f"{pods_file}|{nodes_file}"
    if key not in _CACHE:
        nodes = load_nodes(Path(nodes_file))
        pods = [p.request for p in load_pods(Path(pods_file)) if p.request.num_gpu > 0]
        _CACHE[key] = (nodes, pods)
    nodes, pods = _CACHE[key]
    cap = WHOLE * sum(n.gpus for n in nodes)
    stream = arrival_stream(pods, cap, seed)
    return run_one(nodes, pods, stream, policy, label=pod_label(Path(pods_file)), seed=seed)


def run_bench(
    pod_files: Sequence[Path], nodes_file: Path, policies: Sequence[str], seeds: Sequence[int], jobs: int = 1
) -> list[RunResult]:
    """Every (pod list, seed, policy), in `jobs` processes; results in that order."""
    tasks = [(str(p), str(nodes_file), s, pol) for p in pod_files for s in seeds for pol in policies]
    # the slowest policies first, so the pool's last tasks are short
    order = sorted(range(len(tasks)), key=lambda i: not tasks[i][3].startswith("fgd"))
    results: list[RunResult | None] = [None] * len(tasks)
    if jobs <= 1:
        for i in order:
            results[i] = _job(tasks[i])
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for i, r in zip(order, pool.map(_job, [tasks[i] for i in order]), strict=True):
                results[i] = r
    return [r for r in results if r is not None]


def summarise(results: Sequence[RunResult]) -> dict[str, Any]:
    """Means over seeds per (pod list, policy), and the floors' checks (fgd and fgd+ vs best-fit)."""
    by: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        by.setdefault((r.pods, r.policy), []).append(r)
    rows = []
    for (pods, policy), rs in by.items():
        n = len(rs)
        rows.append(
            {
                "pods": pods,
                "policy": policy,
                "seeds": [r.seed for r in rs],
                "unallocated_at_100": sum(r.unallocated_at_100 for r in rs) / n,
                "rejected_at_100": sum(r.rejected_at_100 for r in rs) / n,
                "rejected_gpu_at_100": sum(r.rejected_gpu_at_100 for r in rs) / n,
                "rejected_multi_at_100": sum(r.rejected_multi_at_100 for r in rs) / n,
                "first_multi_reject_min": min(
                    (r.first_multi_reject for r in rs if r.first_multi_reject is not None), default=None
                ),
                "unallocated_end": sum(r.unallocated_end for r in rs) / n,
                "rejected_end": sum(r.rejected_end for r in rs) / n,
                "rejected_gpu_end": sum(r.rejected_gpu_end for r in rs) / n,
                "seconds": sum(r.seconds for r in rs) / n,
            }
        )
    floors: dict[str, Any] = {}
    pod_lists = list(dict.fromkeys(r.pods for r in results))
    for cand in ("fgd", "fgd+"):
        if not any(r.policy == cand for r in results) or not any(r.policy == "best-fit" for r in results):
            continue
        per_seed: list[dict[str, Any]] = []
        for r in results:
            if r.policy != cand:
                continue
            bf = next(b for b in results if b.policy == "best-fit" and b.pods == r.pods and b.seed == r.seed)
            per_seed.append(
                {
                    "pods": r.pods,
                    "seed": r.seed,
                    "best_fit": bf.unallocated_at_100,
                    cand: r.unallocated_at_100,
                    "below_best_fit": r.unallocated_at_100 < bf.unallocated_at_100,
                }
            )
        means = {
            p: (
                sum(x["best_fit"] for x in per_seed if x["pods"] == p) / max(1, sum(x["pods"] == p for x in per_seed)),
                sum(x[cand] for x in per_seed if x["pods"] == p) / max(1, sum(x["pods"] == p for x in per_seed)),
            )
            for p in pod_lists
        }
        bf_mean = sum(b for b, _ in means.values()) / len(means)
        c_mean = sum(c for _, c in means.values()) / len(means)
        floors[cand] = {
            "per_seed": per_seed,
            "below_best_fit_every_seed": all(x["below_best_fit"] for x in per_seed),
            "best_fit_mean_unallocated": bf_mean,
            "mean_unallocated": c_mean,
            "relative_reduction": (bf_mean - c_mean) / bf_mean if bf_mean else 0.0,
            "pod_lists": pod_lists,
        }
    return {"rows": rows, "floors": floors}


def format_table(summary: dict[str, Any]) -> str:
    lines = [
        "| pod list | policy | unallocated GPU at 100% | rejected pods at 100% | rejected GPU at 100% "
        "| of which 2+ GPU pods | earliest 2+ GPU rejection (arrived) | unallocated at 130% | rejected pods at 130% "
        "| rejected GPU at 130% | s/run |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in summary["rows"]:
        first = r["first_multi_reject_min"]
        first_txt = "-" if first is None else f"{100 * first:.0f}%"
        lines.append(
            f"| {r['pods']} | {r['policy']} | {100 * r['unallocated_at_100']:.2f}% | {r['rejected_at_100']:.1f} "
            f"| {r['rejected_gpu_at_100']:.1f} | {r['rejected_multi_at_100']:.1f} | {first_txt} "
            f"| {100 * r['unallocated_end']:.2f}% | {r['rejected_end']:.1f} "
            f"| {r['rejected_gpu_end']:.1f} | {r['seconds']:.1f} |"
        )
    for cand, f in summary["floors"].items():
        lines.append("")
        lines.append(
            f"{cand} vs best-fit: mean unallocated over {', '.join(f['pod_lists'])}: "
            f"{100 * f['mean_unallocated']:.2f}% vs {100 * f['best_fit_mean_unallocated']:.2f}% "
            f"= {100 * f['relative_reduction']:.1f}% fewer; below best-fit on every list and seed: "
            f"{f['below_best_fit_every_seed']}"
        )
        for x in f["per_seed"]:
            lines.append(
                f"  {x['pods']} seed {x['seed']}: best-fit {100 * x['best_fit']:.2f}%  {cand} {100 * x[cand]:.2f}%"
            )
    return "\n".join(lines)


def plot(results: Sequence[RunResult], path: Path) -> None:
    """Allocated share vs arrived demand per policy (mean of the seeds), one column per pod list:
    the whole run on top, zoomed on 85-130% arrived below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pod_lists = list(dict.fromkeys(r.pods for r in results))
    policies = list(dict.fromkeys(r.policy for r in results))
    fig, axes = plt.subplots(2, len(pod_lists), figsize=(5.2 * len(pod_lists), 8.4), squeeze=False)
    for col, pods in enumerate(pod_lists):
        for row, (xlim, ylim) in enumerate((((0, 130), (0, 100)), ((85, 130), (82, 100)))):
            ax = axes[row][col]
            for policy in policies:
                runs = [r for r in results if r.pods == pods and r.policy == policy]
                if not runs:
                    continue
                n = min(len(r.curve) for r in runs)
                xs = [sum(r.curve[i][0] for r in runs) / len(runs) * 100 for i in range(n)]
                ys = [sum(r.curve[i][1] for r in runs) / len(runs) * 100 for i in range(n)]
                ax.plot(xs, ys, label=policy, linewidth=1.8 if policy.startswith("fgd") else 1.0)
            ax.plot([0, 100, 130], [0, 100, 100], color="grey", linestyle=":", linewidth=0.8, label="ideal")
            ax.axvline(100, color="grey", linewidth=0.5)
            ax.set_xlim(*xlim)
            ax.set_ylim(*ylim)
            ax.grid(alpha=0.3)
            ax.set_xlabel("arrived GPU demand (% of capacity)")
            ax.set_ylabel("allocated GPU (% of capacity)")
            if row == 0:
                seeds = len({r.seed for r in results if r.pods == pods})
                ax.set_title(f"openb {pods} (mean of {seeds} seed{'s' if seeds > 1 else ''})")
    axes[0][0].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_json(doc: dict[str, Any], path: Path) -> None:
    """The result document: settings and summary indented, one line per run (curves included)."""
    head = {k: v for k, v in doc.items() if k != "runs"}
    text = json.dumps(head, indent=1)[:-2]
    runs = ",\n".join(json.dumps(r, separators=(",", ":")) for r in doc["runs"])
    path.write_text(f'{text},\n "runs": [\n{runs}\n ]\n}}\n')


def _default(relative: str) -> Path | None:
    return shared_data.locate(f"{OPENB}/{relative}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ibpool bench pack", description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", help="pod list CSV(s), comma-separated (default: the three openb lists)")
    p.add_argument("--nodes", help="node list CSV (default: the openb GPU node list)")
    p.add_argument(
        "--policy",
        default=",".join(DEFAULT_POLICIES),
        help=f"comma-separated, of: {', '.join(POLICIES)} (and the ablations {', '.join(ABLATIONS)})",
    )
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    p.add_argument("--format", choices=("json", "table"), default="table")
    p.add_argument("--plot", help="write the allocated-vs-arrived figure to this PNG")
    p.add_argument("--out", help="also write the full JSON result (runs, curves, summary) to this file")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: CPU count)")
    args = p.parse_args(argv)

    policies = [x.strip() for x in args.policy.split(",") if x.strip()]
    unknown = [x for x in policies if x not in POLICIES and x not in ABLATIONS]
    if unknown:
        known = ", ".join([*POLICIES, *ABLATIONS])
        print(f"unknown policy {', '.join(unknown)}; known: {known}", file=sys.stderr)
        return 2
    if args.pods:
        pod_files = [Path(x.strip()) for x in args.pods.split(",") if x.strip()]
    else:
        found = [_default(x) for x in DEFAULT_PODS]
        if any(f is None for f in found):
            print(f"no --pods given and the openb lists are not under {shared_data.shared_data_dir()}", file=sys.stderr)
            return 2
        pod_files = [f for f in found if f is not None]
    nodes_file = Path(args.nodes) if args.nodes else _default(DEFAULT_NODES)
    if nodes_file is None:
        print(f"no --nodes given and the openb node list is not under {shared_data.shared_data_dir()}", file=sys.stderr)
        return 2
    for f in [*pod_files, nodes_file]:
        if not f.is_file():
            print(f"no such file: {f}", file=sys.stderr)
            return 2
    if args.seeds < 1:
        print("--seeds must be >= 1", file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    try:
        results = run_bench(pod_files, nodes_file, policies, list(range(args.seeds)), jobs=max(1, args.jobs))
    except TraceError as e:
        print(str(e), file=sys.stderr)
        return 2
    wall = time.perf_counter() - t0
    summary = summarise(results)
    doc = {
        "bench": "pack",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "settings": {
            "pods": [f.name for f in pod_files],
            "nodes": nodes_file.name,
            "policies": policies,
            "seeds": list(range(args.seeds)),
            "stop_at": STOP_AT,
            "jobs": args.jobs,
        },
        "wall_seconds": round(wall, 2),
        "summary": summary,
        "runs": [msgspec.to_builtins(r) for r in results],
    }
    if args.out:
        write_json(doc, Path(args.out))
    if args.plot:
        plot(results, Path(args.plot))
    if args.format == "json":
        slim = {k: v for k, v in doc.items() if k != "runs"}
        slim["runs"] = [{k: v for k, v in msgspec.to_builtins(r).items() if k != "curve"} for r in results]
        print(json.dumps(slim, indent=1))
    else:
        print(format_table(summary))
        print(f"\n{len(results)} runs in {wall:.1f} s with {args.jobs} process(es)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
