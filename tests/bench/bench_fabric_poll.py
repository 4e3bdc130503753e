"""Fabric monitor poll benchmark: the CPU one poll of every link costs, without NATS or Postgres.

`bench_fabric_poll.py --hosts 1000,5000,12500 --runs 3` runs, per size and run, a fresh Python
process (`bench_report.run_child`) that builds what the service builds and drives its real path:

  fabric          generators.rail_optimised(hosts) (about 24.5 links per host: 306,592 links at
                  12,500 hosts), the `FabricMonitor` of services/fabric_monitor with the simulated
                  counter source `ibpool run` configures (COUNTER_SOURCE=simulated: `SimulatedSource`,
                  seed 0) and the service's default rules; its topology adopted as `publish_topology`
                  does (FabricIndex, expected widths and speeds, tiers) but without the store
  faults          one link in 997 gets a fault (down, flapping, errors, width, speed, congestion in
                  turn) before the first poll; half of them are cleared before the third steady poll,
                  so links go down, flap, degrade and recover during the run
  polls           one first poll (every link first seen, every verdict stored), then `--polls` steady
                  polls 5 s apart in simulated time, each as `FabricMonitor.poll_once` does it:
                    read   source.read(now)                  (the simulated source's counters)
                    judge  FabricMonitor.judge(samples, healths): every link's rates and verdict,
                           the events, the verdicts to store and the ring samples to keep
                    rest   FabricMonitor.measure (rates for /metrics, state changes per tier, the
                           gauges), the rows `state.save_health` / `state.record_samples` would
                           write (encoded, not sent), and the in-memory updates after the commit
                  CPU is time.process_time, wall is time.perf_counter, per phase; the store
                  transaction and the outbox (NATS) are not run
  per link        a steady poll's CPU divided by the links, in microseconds
  digest          a SHA-256 over every poll's verdicts (all links' new healths), events, stored
                  verdicts and kept samples, outside the timed part: equal digests before and after a
                  change mean the same behaviour

Every figure is the median over the runs of each run's median steady poll (the first poll is
reported apart). Results: tests/bench/results/bench_fabric_poll-latest.json and a table on stdout.
Run from the repository root with the project's virtualenv: `.venv/bin/python tests/bench/bench_fabric_poll.py`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import hashlib
import json
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

from bench_report import machine, run_child

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
INTERVAL_S = 5.0
FAULT_EVERY = 997
FAULT_KINDS: tuple[tuple[str, float], ...] = (
    ("down", 0.0),
    ("flapping", 5.0),
    ("errors", 50.0),
    ("width", 1.0),
    ("speed", 50.0),
    ("congestion", 0.8),
)


def _monitor(topology: Any) -> Any:
    """A FabricMonitor with its topology adopted as `publish_topology` does, no store or bus."""
    from prometheus_client import CollectorRegistry

    from ibpool_core.fabric.index import FabricIndex
    from ibpool_core.fabric.link_health import Expected
    from ibpool_core.fabric.model import LANE_GBPS
    from ibpool_fabric_monitor.bootstrap import source_factory
    from ibpool_fabric_monitor.config import FabricMonitorConfig
    from ibpool_fabric_monitor.link_metrics import link_tiers
    from ibpool_fabric_monitor.service import FabricMonitor

    cfg = FabricMonitorConfig(counter_source="simulated", seed=0)
    kit = types.SimpleNamespace(
        config=cfg,
        metrics=types.SimpleNamespace(registry=CollectorRegistry()),
        store=types.SimpleNamespace(schema="bench"),
        source="fabric-monitor",
    )
    monitor = FabricMonitor(kit, lambda: topology, source_factory(cfg), clock=None)  # type: ignore[arg-type]
    monitor.version, monitor.topology = 1, topology
    monitor.index = FabricIndex(topology)
    monitor.expected = {ln.link_id: Expected(width=ln.width, lane_gbps=LANE_GBPS[ln.speed]) for ln in topology.links}
    monitor.tiers = link_tiers(topology, monitor.index.tiers)
    monitor.source = monitor.make_source(topology)
    return monitor


def one_run(hosts: int, polls: int) -> dict[str, Any]:
    import msgspec

    from ibpool_core.fabric.generators import rail_optimised
    from ibpool_fabric_monitor import state
    from ibpool_sim.fabric_faults import Fault

    topology = rail_optimised(hosts)
    monitor = _monitor(topology)
    links = [ln.link_id for ln in topology.links]
    faulty = links[::FAULT_EVERY]
    t0 = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)
    for i, lid in enumerate(faulty):
        kind, value = FAULT_KINDS[i % len(FAULT_KINDS)]
        monitor.source.fabric.inject(Fault(link_id=lid, kind=kind, value=value), t0)  # type: ignore[arg-type]

    digest = hashlib.sha256()
    cfg = monitor.cfg
    poll_runs: list[dict[str, float]] = []
    gc.collect()
    for k in range(polls + 1):
        now = t0 + dt.timedelta(seconds=INTERVAL_S * k)
        if k == 3:
            for lid in faulty[::2]:
                monitor.source.fabric.clear(lid)
        c0, w0 = time.process_time(), time.perf_counter()
        samples = monitor.source.read(now)
        c1, w1 = time.process_time(), time.perf_counter()
        updated, events, changed, kept = monitor.judge(samples, monitor.healths)
        c2, w2 = time.process_time(), time.perf_counter()
        rates, state_changes, gauges = monitor.measure(samples, monitor.healths, updated)
        verdict_rows = [(h.link_id, h.state, msgspec.json.encode(h).decode(), now) for h in changed.values()]
        sample_rows = [
            (
                s.link_id,
                state.sample_slot(s.at, cfg.poll_interval_s, cfg.history_per_link),
                s.at,
                s.up,
                msgspec.json.encode(s).decode(),
            )
            for s in kept
        ]
        monitor.healths.update(updated)
        monitor.rates, monitor.gauges = rates, gauges
        monitor.polls += 1
        c3, w3 = time.process_time(), time.perf_counter()
        poll_runs.append(
            {
                "cpu_ms": (c3 - c0) * 1e3,
                "wall_ms": (w3 - w0) * 1e3,
                "read_cpu_ms": (c1 - c0) * 1e3,
                "judge_cpu_ms": (c2 - c1) * 1e3,
                "rest_cpu_ms": (c3 - c2) * 1e3,
                "read_wall_ms": (w1 - w0) * 1e3,
                "judge_wall_ms": (w2 - w1) * 1e3,
                "rest_wall_ms": (w3 - w2) * 1e3,
                "events": len(events),
                "verdict_rows": len(verdict_rows),
                "sample_rows": len(sample_rows),
            }
        )
        # What the poll decided, outside the timed part: the same behaviour gives the same digest.
        digest.update(msgspec.json.encode(sorted(updated.items())))
        digest.update(msgspec.json.encode(events))
        digest.update(msgspec.json.encode(sorted(changed)))
        digest.update(msgspec.json.encode(kept))
        g = msgspec.structs.replace(gauges, links={})
        digest.update(msgspec.json.encode([sorted(state_changes.items()), sorted(gauges.links.items()), g]))
        digest.update(msgspec.json.encode(sorted(rates.items())))

    steady = poll_runs[1:]
    nlinks = len(links)
    out: dict[str, Any] = {
        "hosts": len(topology.hosts),
        "links": nlinks,
        "faults": len(faulty),
        "first_poll_cpu_ms": poll_runs[0]["cpu_ms"],
        "first_poll_wall_ms": poll_runs[0]["wall_ms"],
        "events_total": sum(p["events"] for p in poll_runs),
        "verdict_rows_total": sum(p["verdict_rows"] for p in poll_runs),
        "sample_rows_total": sum(p["sample_rows"] for p in poll_runs),
        "digest": digest.hexdigest(),
    }
    for key in (
        "cpu_ms",
        "wall_ms",
        "read_cpu_ms",
        "judge_cpu_ms",
        "rest_cpu_ms",
        "read_wall_ms",
        "judge_wall_ms",
        "rest_wall_ms",
    ):
        out[key] = statistics.median(p[key] for p in steady)
    out["cpu_us_per_link"] = out["cpu_ms"] * 1e3 / nlinks
    out["polls"] = poll_runs
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--hosts", default="1000,5000,12500")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--polls", type=int, default=5, help="steady polls per run, after the first")
    p.add_argument("--label", default="", help="a note stored with the results (e.g. before/after)")
    p.add_argument("--out", default=str(RESULTS / "bench_fabric_poll-latest.json"))
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(one_run(args.child, args.polls)))
        return 0
    started = dt.datetime.now(dt.UTC)
    out: dict[str, Any] = {
        "benchmark": "bench_fabric_poll",
        "label": args.label,
        "started_utc": started.isoformat(timespec="seconds"),
        "command": " ".join(["tests/bench/bench_fabric_poll.py", *sys.argv[1:]]),
        "machine": machine(),
        "runs": args.runs,
        "polls": args.polls,
        "sizes": {},
    }
    print(
        f"{'hosts':>6} {'links':>8} {'CPU ms':>9} {'wall ms':>9} {'read':>8} {'judge':>8} {'rest':>8} "
        f"{'us/link':>8} {'first ms':>9} {'digest':>12}"
    )
    for n in [int(s) for s in args.hosts.split(",")]:
        runs = [run_child(Path(__file__), ["--child", str(n), "--polls", str(args.polls)]) for _ in range(args.runs)]
        numeric = [k for k, v in runs[0].items() if isinstance(v, int | float)]
        med = {k: statistics.median(r[k] for r in runs) for k in numeric}
        digests = sorted({r["digest"] for r in runs})
        out["sizes"][str(n)] = {"median": med, "digests": digests, "runs": runs}
        print(
            f"{n:>6} {med['links']:>8.0f} {med['cpu_ms']:>9.1f} {med['wall_ms']:>9.1f} {med['read_cpu_ms']:>8.1f} "
            f"{med['judge_cpu_ms']:>8.1f} {med['rest_cpu_ms']:>8.1f} {med['cpu_us_per_link']:>8.2f} "
            f"{med['first_poll_cpu_ms']:>9.1f} {','.join(d[:12] for d in digests)}"
        )
    out["finished_utc"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    path = Path(args.out)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
