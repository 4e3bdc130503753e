"""The scheduler's cycle on a large, busy cluster: what one cycle costs as held jobs grow.

`plan_cycle` (`ibpool_core.sched.pool_cycle`, what the scheduler service calls under its lock) runs
here alone over a ledger of `--nodes` 8-GPU nodes (leaves of 32), every node holding `--per-node`
jobs (granted through the allocator's own `allocate.handle`), with the service's default framework
profile, its `PlanCache` kept from cycle to cycle and the GPUs in flight kept as the service keeps
them (`InFlight`). The jobs are given two ways, in the same run:

  book   a `LiveBook` kept by the jobs' changes, as the service keeps it (`state.LiveJobs`), and
         every node's telemetry as a `ChangedMap` (`node_feed.PlacementTelemetry`): the cycle
         reads what changed (now)
  list   the same jobs as a list and the telemetry as a dict: the cycle walks every held job and
         every node's telemetry (the service before; the cache's identity checks still spare the
         rebuilding of what did not change)

Three kinds of cycle, each timed `--cycles` times after three warm-up cycles:

  idle        nothing waiting and nothing changed (the service's timer cycle)
  one job     one 1-GPU job waiting (the cycle a submission wakes)
  one change  one held job ended and its GPUs were granted to a new job since the last cycle (the
              ledger replaced the node and the allocation, the book the job) and one node's
              telemetry changed
  host set    a node was cordoned or uncordoned since the last cycle: the cycle's hosts changed,
              and what is kept per host list is built anew

and, from cProfile over the idle cycles of the book, the functions that take the most of it.
No floor: the figures go to docs/scale.md. Results: tests/bench/results/bench_sched_cycle-latest.json.
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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
from bench_report import machine, run_child

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
T0 = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)
LEAF = "ibpool.io/leaf"


def one_run(nodes: int, per_node: int, cycles: int) -> dict[str, Any]:
    from ibpool_core.pool import allocate as al
    from ibpool_core.pool.ledger import Ledger
    from ibpool_core.sched import records
    from ibpool_core.sched.book import ChangedMap, LiveBook
    from ibpool_core.sched.cycle import CycleConfig
    from ibpool_core.sched.framework import Framework, Telemetry, build_profile
    from ibpool_core.sched.pool_cycle import InFlight, PlacementInputs, PlanCache, plan_cycle
    from ibpool_core.sched.queueing import make_policy
    from ibpool_core.sched.records import JobRecord
    from ibpool_proto.health import Cordoned, Uncordoned
    from ibpool_proto.node import GpuInfo, NodeRegistered
    from ibpool_proto.pool import GpuAssignment, ProposePlacement, ReleaseAllocation
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
    policy, config = make_policy("fifo"), CycleConfig()
    t = [10.0]

    # Every node's telemetry, as the service keeps it (a ChangedMap) and as a plain dict (before).
    kept: ChangedMap[Telemetry] = ChangedMap()
    for i, n in enumerate(ids):
        kept.put(n, Telemetry(gpu_util=(i % 10) / 10, temperature_c=60.0))
    plain = dict(kept)

    flights: list[InFlight] = []

    def timer(jobs: Sequence[JobRecord], telemetry: Mapping[str, Telemetry]) -> Callable[[], float]:
        inputs = PlacementInputs(framework=Framework(build_profile(DEFAULT_PROFILE)), telemetry=telemetry)
        cache = PlanCache()
        in_flight = InFlight()
        flights.append(in_flight)
        for j in live:
            in_flight.add(j)

        def cycle() -> float:
            t[0] += 1.0
            start = time.perf_counter()
            plan_cycle(ledger, jobs, T0 + dt.timedelta(seconds=t[0]), policy, config, LEAF, cache, placement=inputs,
                       in_flight=in_flight.taken(ledger))  # fmt: skip
            return time.perf_counter() - start

        return cycle

    book = LiveBook()
    for seq, j in enumerate(live):
        book.put(seq, j)
    listed = list(live)
    cycles_of = {"book": timer(book, kept), "list": timer(listed, plain)}
    out: dict[str, Any] = {"nodes": nodes, "held_jobs": len(live)}
    for way, cycle in cycles_of.items():
        for _ in range(3):
            cycle()
        out[f"{way}_idle_ms"] = statistics.median(cycle() for _ in range(cycles)) * 1e3
    new = JobRecord(job_id="new", tenant="t", queue="q", gpus_per_host=1, hosts=1, submitted_at=T0, queued_at=T0)
    book.put(len(live), new)
    listed.append(new)
    for way, cycle in cycles_of.items():
        out[f"{way}_one_job_ms"] = statistics.median(cycle() for _ in range(cycles)) * 1e3
    book.drop("new")
    listed.pop()
    # Between every two cycles one held job ends and its GPUs are granted to a new job (the ledger
    # replaces its node and the allocation; the book the job's record), and one node's telemetry changes.
    times: dict[str, list[float]] = {"book": [], "list": []}
    for k in range(cycles):
        i = k % len(live)
        old = listed[i]
        assert old.allocation_id is not None
        al.handle(ledger, ReleaseAllocation(source="bench", key=old.allocation_id, allocation_id=old.allocation_id), T0)
        j = msgspec.structs.replace(old, job_id=f"again-{k}", state="queued", allocation_id=None)
        cmd = ProposePlacement(
            source="bench", key=j.job_id, job_id=j.job_id, tenant="t", queue="q",
            ledger_version=ledger.version, assignments=old.assignments,
        )  # fmt: skip
        al.handle(ledger, cmd, T0)
        again = records.granted(records.proposed(j, cmd.id, old.assignments, None), cmd.id, old.nodes, T0)
        book.drop(old.job_id)
        book.put(len(live) + 1 + k, again)
        listed[i] = again
        for flight in flights:
            flight.remove(old)
            flight.add(again)
        hot = Telemetry(gpu_util=0.95, temperature_c=60.0 + k % 2)
        kept.put(ids[i // per_node], hot)
        plain[ids[i // per_node]] = hot
        for way, cycle in cycles_of.items():
            times[way].append(cycle())
    for way, ts in times.items():
        out[f"{way}_one_change_ms"] = statistics.median(ts) * 1e3
    # A node is cordoned (it leaves the cycle's hosts) or uncordoned before every cycle: the host
    # set changed, so the host view, the placement view and the running pictures are built anew.
    times = {"book": [], "list": []}
    for k in range(cycles):
        n = ids[k // 2]
        kind = Cordoned if k % 2 == 0 else Uncordoned
        change = kind(source="bench", key=n, node_id=n, scope="node", reason="bench")
        al.handle(ledger, change, T0)
        for way, cycle in cycles_of.items():
            times[way].append(cycle())
    for way, ts in times.items():
        out[f"{way}_host_set_ms"] = statistics.median(ts) * 1e3
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(cycles):
        cycles_of["book"]()
    prof.disable()
    stats = pstats.Stats(prof)
    total = max(stats.total_tt, 1e-9)  # type: ignore[attr-defined]
    own = sorted(
        ((v[2] / total, f"{Path(file).name}:{name}") for (file, _, name), v in stats.stats.items()),  # type: ignore[attr-defined]
        reverse=True,
    )
    out["book_idle_top"] = {name: round(share, 3) for share, name in own[:6]}
    return out


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
    kinds = ("idle", "one_job", "one_change", "host_set")
    keys = [f"{way}_{kind}_ms" for kind in kinds for way in ("book", "list")]
    print(f"{'nodes':>7} {'held jobs':>10}  " + "  ".join(f"{k[:-3]:>16}" for k in keys))
    for n in [int(s) for s in args.nodes.split(",")]:
        child = ["--child", str(n), "--per-node", str(args.per_node), "--cycles", str(args.cycles)]
        runs = [run_child(Path(__file__), child) for _ in range(args.runs)]
        med = {k: statistics.median(r[k] for r in runs) for k in keys}
        out["sizes"][str(n)] = {"median": med, "held_jobs": runs[0]["held_jobs"], "runs": runs}
        print(f"{n:>7} {runs[0]['held_jobs']:>10}  " + "  ".join(f"{med[k]:>14.2f}ms" for k in keys))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_sched_cycle-latest.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
