"""Pool allocator commit throughput through the bus, on the embedded stack.

ProposePlacement commands published to NATS -> the pool allocator service (run in-process: Kit +
bootstrap + Service, as tests/integration/test_pool_allocator.py does) -> AllocationGranted
committed in Postgres and published. nats-server runs with `sync_interval: always`, Postgres with
fsync on, both started here in a temp dir and always stopped.

Before the runs, NODES nodes x GPUS_PER_NODE GPUs are registered through NodeRegistered events.
Every proposal asks for a 100-milli fraction (1/10 of the GPU's memory) of one GPU; within a phase
every proposal names a distinct GPU, and each phase uses its own tenth of every GPU, so nothing
ever conflicts and each run sees the same free pool.

  throughput  N proposals published as fast as publish_async goes (window 256); time from the
              first publish to the last AllocationGranted seen on a core NATS subscription
  latency     M proposals offered at a fixed RATE/s; per command publish -> grant received

Every phase also records the 1-minute load average when it started, the CPU seconds that the
benchmark process (publisher, subscriber and allocator together), nats-server and Postgres (all its
processes) spent during it, and the CPU seconds the hypervisor stole from the machine meanwhile
(`steal_s`), so a run on a busy machine can be told from a slow allocator.

Figures are the median over --runs. Results: tests/bench/results/bench_pool-latest.json.
Usage: .venv/bin/python tests/bench/bench_pool.py --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import nats
from bench_cpu import CpuMeter

from ibpool_pool_allocator.bootstrap import bootstrap
from ibpool_pool_allocator.config import PoolAllocatorConfig
from ibpool_proto import decode
from ibpool_proto.node import GpuInfo, NodeRegistered
from ibpool_proto.pool import AllocationGranted, AllocationRejected, GpuAssignment, ProposePlacement
from ibpool_runtime import devstack
from ibpool_runtime.bus import Bus, outgoing
from ibpool_runtime.logs import configure_logging
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit, Service
from ibpool_runtime.store import Store

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MODEL = "H100-80GB"
GPU_MEMORY_MIB = 81_920
FRACTION_MILLI = 100
SLOTS_PER_GPU = 1000 // FRACTION_MILLI  # 10
PHASE_TIMEOUT_S = 120.0
FLOOR_GRANTS_PER_S = 1000.0
FLOOR_P99_MS = 50.0


async def publish_paced(bus: Bus, cmds: Sequence[Any], rate: float) -> tuple[dict[str, int], float]:
    """Publish `cmds` at `rate` per second (publish_async) and await every ack: each job id's send
    time (perf_counter ns) and how long the offering took (s)."""
    sent: dict[str, int] = {}
    futures = []
    start = time.perf_counter()
    for i, c in enumerate(cmds):
        o = outgoing(c)
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent[c.job_id] = time.perf_counter_ns()
        futures.append(await bus.js.publish_async(o.subject, o.body, headers=o.headers))
    offered_s = time.perf_counter() - start
    await asyncio.wait_for(asyncio.gather(*futures), timeout=PHASE_TIMEOUT_S)
    return sent, offered_s


def pct(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return float(sorted_values[k])


def registered(node_id: str, gpus: int) -> NodeRegistered:
    return NodeRegistered(
        source="bench",
        key=node_id,
        node_id=node_id,
        hostname=node_id,
        cpu_milli=256_000,
        memory_mib=2_048_000,
        gpus=[GpuInfo(index=i, uuid=f"GPU-{node_id}-{i}", model=MODEL, memory_mib=GPU_MEMORY_MIB) for i in range(gpus)],
        backend="bench",
    )


def proposal(job: str, node_id: str, gpu: int, version: int) -> ProposePlacement:
    return ProposePlacement(
        source="bench",
        key=job,
        job_id=job,
        tenant="bench",
        queue="bench",
        ledger_version=version,
        assignments=[
            GpuAssignment(
                node_id=node_id,
                gpu_index=gpu,
                milli=FRACTION_MILLI,
                memory_mib=GPU_MEMORY_MIB // SLOTS_PER_GPU,
            )
        ],
        lease_s=3600.0,
    )


class Answers:
    """AllocationGranted / AllocationRejected seen on a core NATS subscription, by job id."""

    def __init__(self) -> None:
        self.granted: dict[str, int] = {}
        self.rejected: dict[str, str] = {}
        self.event = asyncio.Event()
        self.expect: set[str] = set()
        self.answered = 0

    def reset(self, jobs: set[str]) -> None:
        self.expect = jobs
        self.answered = 0
        self.event.clear()

    def _count(self, job: str) -> None:
        if job in self.expect:
            self.answered += 1
            if self.answered >= len(self.expect):
                self.event.set()

    async def on_granted(self, msg: Any) -> None:
        now = time.perf_counter_ns()
        ev = decode(msg.data)
        if isinstance(ev, AllocationGranted) and ev.job_id not in self.granted:
            self.granted[ev.job_id] = now
            self._count(ev.job_id)

    async def on_rejected(self, msg: Any) -> None:
        ev = decode(msg.data)
        if isinstance(ev, AllocationRejected) and ev.job_id not in self.rejected:
            self.rejected[ev.job_id] = ev.reason
            self._count(ev.job_id)

    async def wait(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self.event.wait(), timeout=timeout_s)
            return True
        except TimeoutError:
            return False


async def ledger(http_url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{http_url}/v1/pool") as r:
        r.raise_for_status()
        return await r.json()


async def register_nodes(bus: Bus, http_url: str, nodes: list[str], gpus: int) -> int:
    await bus.publish_batch([outgoing(registered(n, gpus)) for n in nodes], timeout_s=60)
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while time.monotonic() < deadline:
        pool = await ledger(http_url)
        if len(pool.get("nodes", [])) >= len(nodes):
            return int(pool["ledger_version"])
        await asyncio.sleep(0.2)
    raise RuntimeError(f"nodes not registered within {PHASE_TIMEOUT_S} s")


def targets(nodes: list[str], gpus: int, n: int) -> list[tuple[str, int]]:
    every = [(node, g) for node in nodes for g in range(gpus)]
    if n > len(every):
        raise ValueError(f"{n} proposals need {n} distinct GPUs; only {len(every)} registered")
    return every[:n]


async def phase_throughput(
    bus: Bus, answers: Answers, http_url: str, nodes: list[str], gpus: int, n: int, tag: str, meter: CpuMeter
) -> dict[str, Any]:
    version = int((await ledger(http_url))["ledger_version"])
    cmds = [proposal(f"{tag}-{i:05d}", node, g, version) for i, (node, g) in enumerate(targets(nodes, gpus, n))]
    outs = [outgoing(c) for c in cmds]
    jobs = {c.job_id for c in cmds}
    answers.reset(jobs)
    meter.start()
    t0 = time.perf_counter_ns()
    futures = [await bus.js.publish_async(o.subject, o.body, headers=o.headers) for o in outs]
    await asyncio.wait_for(asyncio.gather(*futures), timeout=PHASE_TIMEOUT_S)
    t_published = time.perf_counter_ns()
    complete = await answers.wait(PHASE_TIMEOUT_S)
    machine = meter.stop()
    grants = [answers.granted[j] for j in jobs if j in answers.granted]
    rejected = [answers.rejected[j] for j in jobs if j in answers.rejected]
    span = (max(grants) - t0) if grants else 0
    return {
        "n": n,
        "granted": len(grants),
        "rejected": len(rejected),
        "rejection_reasons": sorted(set(rejected)),
        "complete": complete,
        "publish_s": round((t_published - t0) / 1e9, 3),
        "span_s": round(span / 1e9, 3),
        "grants_per_s": round(len(grants) / (span / 1e9), 1) if span > 0 else float("nan"),
        **machine,
    }


async def phase_latency(
    bus: Bus,
    answers: Answers,
    http_url: str,
    nodes: list[str],
    gpus: int,
    n: int,
    rate: float,
    tag: str,
    meter: CpuMeter,
) -> dict[str, Any]:
    version = int((await ledger(http_url))["ledger_version"])
    cmds = [proposal(f"{tag}-{i:05d}", node, g, version) for i, (node, g) in enumerate(targets(nodes, gpus, n))]
    answers.reset({c.job_id for c in cmds})
    meter.start()
    sent, offered_s = await publish_paced(bus, cmds, rate)
    complete = await answers.wait(PHASE_TIMEOUT_S)
    machine = meter.stop()
    lat_ms = sorted((answers.granted[j] - t) / 1e6 for j, t in sent.items() if j in answers.granted)
    rejected = [answers.rejected[j] for j in sent if j in answers.rejected]
    return {
        "n": n,
        "offered_per_s": rate,
        "achieved_offer_per_s": round(n / offered_s, 1) if offered_s > 0 else float("nan"),
        "granted": len(lat_ms),
        "rejected": len(rejected),
        "rejection_reasons": sorted(set(rejected)),
        "complete": complete,
        "p50_ms": round(pct(lat_ms, 50), 3),
        "p99_ms": round(pct(lat_ms, 99), 3),
        "max_ms": round(pct(lat_ms, 100), 3),
        **machine,
    }


async def bench(args: argparse.Namespace, nats_url: str, dsn: str, pids: dict[str, int]) -> dict[str, Any]:
    if 2 * args.runs > SLOTS_PER_GPU:
        raise ValueError(f"at most {SLOTS_PER_GPU // 2} runs (each phase uses a tenth of every GPU)")
    bus = await Bus.connect(nats_url, name="bench-pool")
    store: Store | None = None
    service: Service | None = None
    sub_nc = None
    try:
        await bus.ensure_streams()
        store = await Store.connect(dsn, "bench_pool")
        await store.migrate()
        cfg = PoolAllocatorConfig(instance="bench", durable_prefix="pool-allocator-bench", log_level="warning")
        kit = Kit(name="pool_allocator", config=cfg, bus=bus, store=store, metrics=ServiceMetrics("pool_allocator"))
        service = Service(kit, await bootstrap(kit))
        await service.start()
        http_url = service.http_url

        answers = Answers()
        sub_nc = await nats.connect(nats_url, name="bench-pool-sub", connect_timeout=5)
        await sub_nc.subscribe(AllocationGranted.subject_pattern(), cb=answers.on_granted, pending_msgs_limit=-1)
        await sub_nc.subscribe(AllocationRejected.subject_pattern(), cb=answers.on_rejected, pending_msgs_limit=-1)
        await sub_nc.flush()

        nodes = [f"bn{i:04d}" for i in range(args.nodes)]
        t = time.perf_counter()
        version = await register_nodes(bus, http_url, nodes, args.gpus)
        print(f"registered {len(nodes)} nodes x {args.gpus} GPUs in {time.perf_counter() - t:.1f} s (v{version})")

        runs = []
        meter = CpuMeter(pids)
        for r in range(args.runs):
            tp = await phase_throughput(bus, answers, http_url, nodes, args.gpus, args.n, f"tp{r}", meter)
            print(f"run {r + 1} throughput: {tp}")
            await asyncio.sleep(1.0)
            lat = await phase_latency(bus, answers, http_url, nodes, args.gpus, args.lat_n, args.rate, f"lat{r}", meter)
            print(f"run {r + 1} latency: {lat}")
            runs.append({"throughput": tp, "latency": lat})
            await asyncio.sleep(1.0)
        return {"runs": runs}
    finally:
        if sub_nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(sub_nc.close(), timeout=5)
        if service is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(service.stop(), timeout=30)
        if store is not None:
            with contextlib.suppress(Exception):
                await store.close()
        with contextlib.suppress(Exception):
            await bus.close()


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def med(phase: str, key: str) -> float:
        return round(statistics.median(float(r[phase][key]) for r in runs), 3)

    grants = med("throughput", "grants_per_s")
    p99 = med("latency", "p99_ms")
    all_granted = all(
        r[p]["granted"] == r[p]["n"] and not r[p]["rejected"] for r in runs for p in ("throughput", "latency")
    )
    per_grant: dict[str, float | None] = {}
    for name in runs[0]["throughput"]["cpu_s"]:
        spent = [r["throughput"]["cpu_s"][name] for r in runs]
        per_grant[name] = (
            None if None in spent else round(statistics.median(1000 * c / runs[0]["throughput"]["n"] for c in spent), 3)
        )
    return {
        "grants_per_s": grants,
        "throughput_span_s": med("throughput", "span_s"),
        "throughput_cpu_ms_per_command": per_grant,
        "load_1m_at_start": [r[p]["load_1m_at_start"] for r in runs for p in ("throughput", "latency")],
        "latency_p50_ms": med("latency", "p50_ms"),
        "latency_p99_ms": p99,
        "latency_max_ms": med("latency", "max_ms"),
        "every_command_granted": all_granted,
        "floor_grants_per_s": FLOOR_GRANTS_PER_S,
        "floor_p99_ms": FLOOR_P99_MS,
        "pass_throughput": grants >= FLOOR_GRANTS_PER_S and all_granted,
        "pass_latency": p99 < FLOOR_P99_MS and all_granted,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, default=3000, help="proposals in the throughput phase")
    ap.add_argument("--lat-n", type=int, default=2000, help="proposals in the latency phase")
    ap.add_argument("--rate", type=float, default=500.0, help="offered rate of the latency phase, per s")
    ap.add_argument("--nodes", type=int, default=400)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_pool-latest.json")
    args = ap.parse_args()
    configure_logging("bench", "warning")

    with devstack.servers("ibpool-bench-pool-", sync_always=True) as stack:
        result = asyncio.run(bench(args, stack.nats_url, stack.postgres_dsn, stack.pids))

    summary = summarise(result["runs"])
    doc = {
        "bench": "bench_pool",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "settings": {
            "runs": args.runs,
            "throughput_n": args.n,
            "latency_n": args.lat_n,
            "latency_rate_per_s": args.rate,
            "nodes": args.nodes,
            "gpus_per_node": args.gpus,
            "fraction_milli": FRACTION_MILLI,
            "nats_sync": "always",
            "postgres_fsync": True,
        },
        "summary": summary,
        "runs": result["runs"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
