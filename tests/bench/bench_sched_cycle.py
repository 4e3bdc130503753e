"""The scheduler's cycle on a large, busy cluster: what one cycle costs as held jobs grow.

`plan_cycle` (`ibpool_core.sched.pool_cycle`, what the scheduler service calls under its lock) runs
here alone over a ledger of `--nodes` 8-GPU nodes (leaves of 32), every node holding `--per-node`
jobs (granted through the allocator's own `allocate.handle`), with the service's default framework
profile, its `PlanCache` kept from cycle to cycle and the GPUs in flight kept as the service keeps
them (`InFlight`). Two kinds of cycle, each timed `--cycles` times after three warm-up cycles:

  idle        nothing waiting (the service's timer cycle: kills past their limit, nothing to place)
  one job     one 1-GPU job waiting (the cycle a submission wakes)

and, from cProfile over the idle cycles, the share of the parts that walk every held job or every
host. No floor: the figures go to docs/scale.md (what is still owed: a cycle bounded by what changed).
Results: tests/bench/results/bench_sched_cycle-latest.json.
Usage: .venv/bin/python tests/bench/bench_sched_cycle.py --nodes 1000,5000,12500 --per-node 2
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import json
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_report import machine, run_child

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
T0 = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)
LEAF = "ibpool.io/leaf"
# Functions whose own time is a walk over every held job or every host, by the name cProfile gives.
WALKS = {
    "running_jobs": "held jobs: their running picture (identity checks against the cache)",
    "__init__": "hosts: the free view of the cycle (placer.FreeView)",
    "<listcomp>": "held jobs: past their limit; live jobs: the waiting ones",
}


def one_run(nodes: int, per_node: int, cycles: int) -> dict[str, Any]:
    from ibpool_core.pool import allocate as al
    from ibpool_core.pool.ledger import Ledger
    from ibpool_core.sched import records
    from ibpool_core.sched.cycle import CycleConfig
    from ibpool_core.sched.framework import Framework, build_profile
    from ibpool_core.sched.pool_cycle import InFlight, PlacementInputs, PlanCache, plan_cycle
    from ibpool_core.sched.queueing import make_policy
    from ibpool_core.sched.records import JobRecord
    from ibpool_proto.node import GpuInfo, NodeRegistered
    from ibpool_proto.pool import GpuAssignment, ProposePlacement
    from ibpool_scheduler.service import DEFAULT_PROFILE

    ledger = Ledger()
    ids = [f"node-{i:05d}" for i in range(nodes)]
    for i, n in enumerate(ids):
        gpus = [
            GpuInfo(index=g, uuid=f"GPU-{n}-{g}", model="NVIDIA H100 80GB HBM3", memory_mib=81_559) for g in range(8)
        ]
        al.handle(
            ledger,
            NodeRegistered(
                source="bench", key=n, node_id=n, hostname=n, cpu_milli=64_000, memory_mib=512_000, gpus=gpus,
                backend="bench", labels={LEAF: f"leaf-{i // 32}"},
            ),
            T0,
        )  # fmt: skip
    live: list[JobRecord] = []
    share = 8 // per_node
    for i, n in enumerate(ids):
        for k in range(per_node):
            gpus = share - 1 if k == 0 else share  # one GPU of every node left free
            j = JobRecord(
                job_id=f"job-{i}-{k}", tenant="t", queue="q", gpus_per_host=gpus, hosts=1, submitted_at=T0,
                queued_at=T0, time_limit_s=86_400,
            )  # fmt: skip
            assignments = [GpuAssignment(node_id=n, gpu_index=k * share + g) for g in range(gpus)]
            cmd = ProposePlacement(
                source="bench", key=j.job_id, job_id=j.job_id, tenant="t", queue="q",
                ledger_version=ledger.version, assignments=assignments,
            )  # fmt: skip
            al.handle(ledger, cmd, T0)
            live.append(records.granted(records.proposed(j, cmd.id, assignments, None), cmd.id, [n], T0))
    in_flight = InFlight()
    for j in live:
        in_flight.add(j)
    policy, config = make_policy("fifo"), CycleConfig()
    inputs = PlacementInputs(framework=Framework(build_profile(DEFAULT_PROFILE)))
    cache = PlanCache()
    t = [10.0]

    def cycle(jobs: list[JobRecord]) -> float:
        t[0] += 1.0
        start = time.perf_counter()
        plan_cycle(ledger, jobs, T0 + dt.timedelta(seconds=t[0]), policy, config, LEAF, cache, placement=inputs,
                   in_flight=in_flight.taken(ledger))  # fmt: skip
        return time.perf_counter() - start

    for _ in range(3):
        cycle(live)
    idle = [cycle(live) for _ in range(cycles)]
    new = JobRecord(job_id="new", tenant="t", queue="q", gpus_per_host=1, hosts=1, submitted_at=T0, queued_at=T0)
    waiting = [*live, new]
    one = [cycle(waiting) for _ in range(cycles)]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(cycles):
        cycle(live)
    prof.disable()
    stats = pstats.Stats(prof)
    total = max(stats.total_tt, 1e-9)  # type: ignore[attr-defined]
    walks: dict[str, float] = {}
    for (file, _, name), (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        if name in WALKS and own / total >= 0.01 and any(m in file for m in ("pool_cycle", "placer", "cycle.py")):
            walks[f"{Path(file).name}:{name}"] = walks.get(f"{Path(file).name}:{name}", 0.0) + own / total
    return {
        "nodes": nodes,
        "held_jobs": len(live),
        "idle_ms": statistics.median(idle) * 1e3,
        "one_job_ms": statistics.median(one) * 1e3,
        "walk_share_idle": walks,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--nodes", default="1000,5000,12500")
    p.add_argument("--per-node", type=int, default=2)
    p.add_argument("--cycles", type=int, default=10)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(one_run(args.child, args.per_node, args.cycles)))
        return 0
    out: dict[str, Any] = {"machine": machine(), "per_node": args.per_node, "cycles": args.cycles, "sizes": {}}
    print(f"{'nodes':>7} {'held jobs':>10} {'idle cycle':>11} {'one job':>9}  walks (share of the idle cycle)")
    for n in [int(s) for s in args.nodes.split(",")]:
        child = ["--child", str(n), "--per-node", str(args.per_node), "--cycles", str(args.cycles)]
        runs = [run_child(Path(__file__), child) for _ in range(args.runs)]
        med = {k: statistics.median(r[k] for r in runs) for k in ("idle_ms", "one_job_ms")}
        walks = {
            k: statistics.median(r["walk_share_idle"].get(k, 0.0) for r in runs) for k in runs[0]["walk_share_idle"]
        }
        out["sizes"][str(n)] = {
            "median": med,
            "walk_share_idle": walks,
            "held_jobs": runs[0]["held_jobs"],
            "runs": runs,
        }
        shares = ", ".join(f"{k} {v:.0%}" for k, v in sorted(walks.items(), key=lambda kv: -kv[1]))
        print(f"{n:>7} {runs[0]['held_jobs']:>10} {med['idle_ms']:>9.1f}ms {med['one_job_ms']:>7.1f}ms  {shares}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_sched_cycle-latest.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
