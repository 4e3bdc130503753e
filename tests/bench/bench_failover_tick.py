"""The failover controller's tick at 1,000 to 50,000 nodes: the decision's CPU and what it writes.

A tick of the failover controller runs `ibpool_core.health.decide` over the beats read since the last
one and stores the picture. Here the pure decision runs alone, in this process, over a cluster of N
registered 8-GPU nodes each beating every second and sending telemetry every 5 s, ticking every
0.25 s (the service's defaults: a quarter of the beats per tick), for `--seconds` of simulated time:

  per tick, full walk   `decide(request)`: judging walks every node (the code before 2026-12-05)
  per tick, watched     `decide(request, watch)`: judging looks only at the nodes the caller's
                        `Watch` names (late, with a verdict, connection closed); the same replies
                        (checked on every tick here)
  judged nodes          how many nodes the watched tick judged (max over the ticks)
  written, before       bytes the controller wrote per second before: the whole picture encoded
                        (what `health_state.body` held) at least every 5 s
  written, now          entries the decisions changed (`StateChanges`) and their bytes per second

Each size runs `--runs` times in a fresh process; the table shows the medians. No floor: the figures
go to docs/scale.md. Results: tests/bench/results/bench_failover_tick-latest.json.
Usage: .venv/bin/python tests/bench/bench_failover_tick.py --sizes 1000,5000,12500,50000 --runs 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_report import machine, run_child

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
T0 = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)
# The service's defaults: a tick every 0.25 s, a beat every second, telemetry every 5 s.
TICK_S, BEAT_S, TELEMETRY_S, SAVE_EVERY_S = 0.25, 1.0, 5.0, 5.0


def one_run(nodes: int, seconds: float) -> dict[str, Any]:
    import msgspec

    from ibpool_core.health.decide import STATE_MAPS, FailoverRequest, HealthState, Watch, decide
    from ibpool_proto.node import GpuInfo, GpuSample, NodeHeartbeat, NodeRegistered, TelemetryReported

    ids = [f"node-{i:05d}" for i in range(nodes)]

    def at(t: float) -> dt.datetime:
        return T0 + dt.timedelta(seconds=t)

    def registered(n: str) -> NodeRegistered:
        gpus = [GpuInfo(index=g, uuid=f"{n}-{g}", model="H100", memory_mib=81559) for g in range(8)]
        return NodeRegistered(
            source=f"agent-{n}", key=n, occurred_at=T0, node_id=n, hostname=n, cpu_milli=1, memory_mib=1,
            gpus=gpus, backend="simulated",
        )  # fmt: skip

    def beat(n: str, t: float) -> NodeHeartbeat:
        return NodeHeartbeat(source=f"agent-{n}", key=n, occurred_at=at(t), node_id=n, seq=1, interval_s=BEAT_S)

    def telemetry(n: str, t: float) -> TelemetryReported:
        samples = [
            GpuSample(index=g, uuid=f"{n}-{g}", utilization_pct=50.0, memory_used_mib=1000, temperature_c=50.0,
                      power_w=300.0)
            for g in range(8)
        ]  # fmt: skip
        return TelemetryReported(source=f"agent-{n}", key=n, occurred_at=at(t), node_id=n, gpus=samples)

    first = FailoverRequest(state=HealthState(), now=T0, observations=[registered(n) for n in ids])
    plain_state = decide(first).state
    watch = Watch()
    watched_state = decide(first, watch).state
    full_s: list[float] = []
    watched_s: list[float] = []
    judged: list[int] = []
    entries = 0
    entry_bytes = 0
    t = 0.0
    quarter = max(1, nodes // 4)
    k = 0
    while t < seconds - 1e-9:
        t = round(t + TICK_S, 6)
        part = ids[(k % 4) * quarter : (k % 4 + 1) * quarter]
        k += 1
        obs: list[Any] = [beat(n, t) for n in part]
        if t % TELEMETRY_S < TICK_S:
            obs += [telemetry(n, t) for n in ids[: nodes // 20]]  # a twentieth of the nodes each tick
        t0 = time.perf_counter()
        plain = decide(FailoverRequest(state=plain_state, now=at(t), observations=obs))
        t1 = time.perf_counter()
        watched = decide(FailoverRequest(state=watched_state, now=at(t), observations=obs), watch)
        t2 = time.perf_counter()
        if msgspec.json.encode(plain) != msgspec.json.encode(watched):
            raise SystemExit(f"the watched decision differs at t={t}")
        plain_state, watched_state = plain.state, watched.state
        full_s.append(t1 - t0)
        watched_s.append(t2 - t1)
        judged.append(watch.judged)
        for name in STATE_MAPS:
            live = getattr(watched_state, name)
            for key in getattr(watched.changes, name):
                entries += 1
                entry_bytes += len(msgspec.json.encode(live[key])) if key in live else 0
    whole = len(msgspec.json.encode(watched_state))
    return {
        "nodes": nodes,
        "ticks": len(full_s),
        "tick_full_ms": statistics.median(full_s) * 1e3,
        "tick_watched_ms": statistics.median(watched_s) * 1e3,
        "cores_full": sum(full_s) / seconds,
        "cores_watched": sum(watched_s) / seconds,
        "judged_max": max(judged),
        "state_bytes": whole,
        "written_before_bytes_per_s": whole / SAVE_EVERY_S,
        "written_now_entries_per_s": entries / seconds,
        "written_now_bytes_per_s": entry_bytes / seconds,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--sizes", default="1000,5000,12500,50000")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=20.0, help="simulated time per run (after the registrations)")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(one_run(args.child, args.seconds)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    out: dict[str, Any] = {"machine": machine(), "seconds": args.seconds, "runs": args.runs, "sizes": {}}
    print(f"{'nodes':>7} {'tick full':>10} {'watched':>9} {'ratio':>6} {'judged':>7} {'state MB':>9} "
          f"{'wrote before':>13} {'now':>10}")  # fmt: skip
    for n in sizes:
        runs = [
            run_child(Path(__file__), ["--child", str(n), "--seconds", str(args.seconds)]) for _ in range(args.runs)
        ]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "nodes"}
        out["sizes"][str(n)] = {"median": med, "runs": runs}
        print(
            f"{n:>7} {med['tick_full_ms']:>8.2f}ms {med['tick_watched_ms']:>7.2f}ms "
            f"{med['tick_full_ms'] / med['tick_watched_ms']:>6.1f} {med['judged_max']:>7.0f} "
            f"{med['state_bytes'] / 1e6:>9.2f} {med['written_before_bytes_per_s'] / 1e3:>9.0f} kB/s "
            f"{med['written_now_bytes_per_s'] / 1e3:>6.1f} kB/s"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_failover_tick-latest.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
