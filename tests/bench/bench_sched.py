"""Scheduling throughput end to end: SubmitJob on the bus -> scheduler -> pool allocator -> JobScheduled.

`--services process` (the default) runs the scheduler and the pool allocator each as its own process
(`python -m ibpool_scheduler`, `python -m ibpool_pool_allocator`, as `ibpool run` and an operator
start them); `--services inproc` runs both in the benchmark process (Kit + bootstrap + Service, as
tests/integration/test_scheduler.py does), which `--profile` and the garbage-collector figures need.
Either way on an embedded stack started here in a temp dir and always stopped: nats-server and
Postgres (fsync on). Each stack setting runs on its own fresh stack:
`sync_interval: always` and nats-server's default fsync. No node agent runs (jobs need not start).

Before the runs, NODES nodes x GPUS_PER_NODE GPUs are registered through NodeRegistered events
published directly (not 1,000 agents), and the bench waits until the scheduler leads with every node
in its ledger replica. Every job asks for one whole GPU (policy fifo, easy backfill, the defaults
otherwise). After each phase every job of it is cancelled (CancelJob) and the bench waits until
every allocation is released and the job and pool streams and their consumers are idle (`quiesce`),
so each phase meets the same free pool and idle services.

  throughput  N SubmitJob commands published as fast as publish_async goes; time from the first
              publish to the last JobScheduled seen on a core NATS subscription
  latency     M submissions offered at each fixed RATE/s (150 and the floor's 300 by default); per job
              SubmitJob publish -> AllocationGranted received (the issue's "submit -> granted": the
              GPUs are the job's) and SubmitJob publish -> JobScheduled received (the scheduler has
              recorded the grant); the floor is judged on the first, both are reported

Messages per job: what every stream took during the phase (each stream's last sequence), commands
included, over the phase's jobs. The latency phase also times each step of the path on the bus
(submit -> JobQueued -> ProposePlacement, or its place in a cycle's ProposePlacements -> AllocationGranted
-> JobScheduled; `--no-stages` leaves out the subscriptions to JobQueued and the proposals, which load
the same two cores) and every phase reports
the scheduler's cycles (count, mean duration). Every phase also
records the 1-minute load average at its start and the CPU seconds of the benchmark process
(publisher and subscriber, plus scheduler and allocator in-process), of the scheduler and allocator
processes, nats-server and Postgres, the CPU seconds the hypervisor stole from the machine during
the phase (`steal_s`, /proc/stat: on a shared host the same code is slower when it is high), and
in-process how much of the benchmark process's CPU went to Python's garbage collector (`gc_s`, per
generation).

`--placement framework|leaf` (the scheduler's placement plugins, the default, or the plain LeafPlacer)
and `--batch on|off` (a cycle's proposals in one ProposePlacements, the default, or one each).
Figures are the median over --runs. Results: tests/bench/results/bench_sched-latest.json.
`--cycle-only` times the scheduler's cycle alone on a simulated ledger, no bus or store (`cycle_only`).
Usage: .venv/bin/python tests/bench/bench_sched.py --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import datetime as dt
import gc
import json
import os
import platform
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import nats

from ibpool_cli.run import ServiceProcess
from ibpool_pool_allocator.bootstrap import bootstrap as allocator_bootstrap
from ibpool_pool_allocator.config import PoolAllocatorConfig
from ibpool_proto import decode
from ibpool_proto.job import CancelJob, JobQueued, JobScheduled, JobSpec, SubmitJob
from ibpool_proto.pool import AllocationGranted, ProposePlacement, ProposePlacements, ResourceRequest
from ibpool_runtime import devstack
from ibpool_runtime.bus import Bus, outgoing
from ibpool_runtime.logs import configure_logging
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit, Service, freeze_startup_heap
from ibpool_runtime.store import Store
from ibpool_runtime.streams import STREAMS
from ibpool_scheduler.bootstrap import bootstrap as scheduler_bootstrap
from ibpool_scheduler.config import SchedulerConfig
from ibpool_scheduler.service import Scheduler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu import CpuMeter
from bench_pool import pct, publish_paced, registered

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PHASE_TIMEOUT_S = 180.0
FLOOR_JOBS_PER_S = 300.0
FLOOR_P99_MS = 100.0


def submission(job_id: str) -> SubmitJob:
    spec = JobSpec(name=job_id, tenant="bench", queue="bench", request=ResourceRequest(kind="whole", gpus_per_host=1))
    return SubmitJob(source="bench", key=job_id, job_id=job_id, spec=spec)


# The path of one job on the bus, in order: the latency phase splits submit -> scheduled at each step.
STAGES = (JobQueued, ProposePlacement, AllocationGranted, JobScheduled)


class Watch:
    """When each job reached each stage, from core NATS subscriptions, and the messages of each stream.

    The subscriptions run in the benchmark process, on the scheduler's and allocator's core, so the
    throughput phase listens to JobScheduled alone (the job id is the subject's key: no decoding) and
    only the latency phase to every stage. Messages are counted from each stream's last sequence.
    """

    def __init__(self, nc: Any, js: Any) -> None:
        self.nc, self.js = nc, js
        self.seen_at: dict[type, dict[str, int]] = {t: {} for t in STAGES}
        self.scheduled = self.seen_at[JobScheduled]
        self.expect: set[str] = set()
        self.seen = 0
        self.done = asyncio.Event()
        self.stage_subs: list[Any] = []
        self.seqs: dict[str, int] = {}

    async def start(self) -> None:
        await self.nc.subscribe(JobScheduled.subject_pattern(), cb=self._on(JobScheduled), pending_msgs_limit=-1)
        await self.nc.flush()

    async def _stream_seqs(self) -> dict[str, int]:
        return {spec.name: (await self.js.stream_info(spec.name)).state.last_seq for spec in STREAMS}

    async def reset(self, jobs: set[str], *, granted: bool = False, stages: bool = False) -> None:
        """Expect `jobs`; `granted`: also time their grants; `stages`: also every other step of their path."""
        self.expect, self.seen = jobs, 0
        self.done.clear()
        for t in STAGES[:-1] if stages else (AllocationGranted,) if granted else ():
            sub = await self.nc.subscribe(t.subject_pattern(), cb=self._on(t), pending_msgs_limit=-1)
            self.stage_subs.append(sub)
        if stages:
            # A cycle's proposals in one ProposePlacements: each placement reaches the "proposed" stage.
            sub = await self.nc.subscribe(ProposePlacements.subject_pattern(), cb=self._on_batch, pending_msgs_limit=-1)
            self.stage_subs.append(sub)
        await self.nc.flush()
        self.seqs = await self._stream_seqs()

    def _on(self, stage: type) -> Any:
        times = self.seen_at[stage]

        async def on_message(msg: Any) -> None:
            now = time.perf_counter_ns()
            # The job is the key of every stage but the grant (keyed by node): that one is decoded.
            job_id = decode(msg.data).job_id if stage is AllocationGranted else msg.subject.rsplit(".", 1)[1]
            if job_id in times:
                return
            times[job_id] = now
            if stage is JobScheduled and job_id in self.expect:
                self.seen += 1
                if self.seen >= len(self.expect):
                    self.done.set()

        return on_message

    async def _on_batch(self, msg: Any) -> None:
        now = time.perf_counter_ns()
        batch = decode(msg.data)
        if isinstance(batch, ProposePlacements):
            times = self.seen_at[ProposePlacement]
            for p in batch.placements:
                times.setdefault(p.job_id, now)

    async def wait(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self.done.wait(), timeout=timeout_s)
            return True
        except TimeoutError:
            return False

    async def finish(self, n: int) -> dict[str, Any]:
        """Stop the stage subscriptions; the messages each stream took during the phase, per job."""
        for sub in self.stage_subs:
            await sub.unsubscribe()
        self.stage_subs = []
        now = await self._stream_seqs()
        by_stream = {k: round((now[k] - self.seqs[k]) / n, 3) for k in now if now[k] != self.seqs[k]}
        return {"messages_per_job": round(sum(by_stream.values()), 3), "messages_per_job_by_stream": by_stream}

    def stages_ms(self, sent: dict[str, int]) -> dict[str, dict[str, float]]:
        """p50/p99 of each step of the path (submit -> queued -> proposed -> granted -> scheduled)."""
        out: dict[str, dict[str, float]] = {}
        before, name = sent, "submit"
        for stage in STAGES:
            after = self.seen_at[stage]
            steps = sorted((after[j] - before[j]) / 1e6 for j in sent if j in after and j in before)
            out[f"{name}->{stage.__name__}"] = {"p50": round(pct(steps, 50), 1), "p99": round(pct(steps, 99), 1)}
            before, name = after, stage.__name__
        return out


class InProcess:
    """The scheduler and the allocator in this process: their state read directly."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched

    async def leading_with(self, nodes: int) -> bool:
        s = self.sched
        return s.is_leader and s.feed.caught_up and len(s.feed.ledger.nodes) >= nodes

    async def cycles(self) -> tuple[float, float]:
        samples = {s.name: s.value for m in self.sched.cycle_seconds.collect() for s in m.samples}
        return samples["ibpool_scheduler_cycle_seconds_count"], samples["ibpool_scheduler_cycle_seconds_sum"]

    async def allocations(self) -> int:
        return len(self.sched.feed.ledger.allocations)


class OwnProcesses:
    """The scheduler and the allocator as their own processes: their state over their HTTP APIs
    (GET /v1/scheduler, /metrics; the allocator's GET /v1/allocations)."""

    def __init__(self, http: aiohttp.ClientSession, scheduler_url: str, allocator_url: str) -> None:
        self.http, self.scheduler_url, self.allocator_url = http, scheduler_url, allocator_url

    async def _get(self, url: str) -> Any:
        async with self.http.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
            r.raise_for_status()
            return await (r.json() if r.content_type == "application/json" else r.text())

    async def leading_with(self, nodes: int) -> bool:
        try:
            about = await self._get(f"{self.scheduler_url}/v1/scheduler")
        except (aiohttp.ClientError, TimeoutError):
            return False  # not up yet
        return bool(about["leader"] and about["ledger_caught_up"] and about["nodes"] >= nodes)

    async def cycles(self) -> tuple[float, float]:
        found: dict[str, float] = {}
        for line in (await self._get(f"{self.scheduler_url}/metrics")).splitlines():
            name, _, value = line.partition(" ")
            if name in ("ibpool_scheduler_cycle_seconds_count", "ibpool_scheduler_cycle_seconds_sum"):
                found[name] = float(value)
        return found["ibpool_scheduler_cycle_seconds_count"], found["ibpool_scheduler_cycle_seconds_sum"]

    async def allocations(self) -> int:
        return len(await self._get(f"{self.allocator_url}/v1/allocations"))


Probe = InProcess | OwnProcesses


async def drain(bus: Bus, probe: Probe, job_ids: list[str]) -> None:
    """Cancel the phase's jobs, wait until no allocation is held, then until the services are quiet."""
    outs = [outgoing(CancelJob(source="bench", key=j, job_id=j, reason="bench phase over")) for j in job_ids]
    await bus.publish_batch(outs, timeout_s=60)
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while time.monotonic() < deadline:
        if not await probe.allocations():
            await quiesce(bus, deadline)
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"allocations not released within {PHASE_TIMEOUT_S} s")


async def quiesce(bus: Bus, deadline: float) -> None:
    """Wait until, at two looks in a row (each 0.3 s after the one before), the job and pool streams
    took no new message since the look before and every consumer of them (the services' durable ones
    and the scheduler's ledger replica) had nothing pending or unacknowledged. The release of the last
    allocation does not end a phase's cancellations: the allocator still publishes the releases'
    events and the scheduler still folds them, and the next phase is to meet services that are idle.
    (A no-ack consumer's pending count falls when it fetches, not when it has applied what it
    fetched: the looks that follow give that time.)"""
    quiet, last_seqs = 0, list[int]()
    while time.monotonic() < deadline:
        busy, seqs = 0, list[int]()
        for stream in ("IBPOOL_JOB", "IBPOOL_POOL"):
            seqs.append(int((await bus.js.stream_info(stream)).state.last_seq))
            for info in await bus.js.consumers_info(stream):
                busy += int(info.num_pending or 0) + int(info.num_ack_pending or 0)
        quiet = quiet + 1 if busy == 0 and seqs == last_seqs else 0
        last_seqs = seqs
        if quiet >= 2:
            return
        await asyncio.sleep(0.3)
    raise RuntimeError(f"the services were not idle within {PHASE_TIMEOUT_S} s of the phase's cancellations")


class GcMeter:
    """Time the benchmark process spends in Python's garbage collector (per generation) during a
    phase, from `gc.callbacks`: part of the process CPU, reported beside it."""

    def __init__(self) -> None:
        self.spent = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._began = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.process_time()
        else:
            g = info["generation"]
            self.spent[g] += time.process_time() - self._began
            self.count[g] += 1

    def start(self) -> None:
        self.spent, self.count = [0.0, 0.0, 0.0], [0, 0, 0]

    def stop(self) -> dict[str, Any]:
        return {
            "gc_s": round(sum(self.spent), 3),
            "gc_s_by_gen": [round(x, 3) for x in self.spent],
            "gc_runs": self.count,
        }


GC = GcMeter()


class Cycles:
    """The scheduler's cycles during a phase, from its `ibpool_scheduler_cycle_seconds` histogram."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.began = (0.0, 0.0)

    async def start(self) -> Cycles:
        self.began = await self.probe.cycles()
        return self

    async def stop(self) -> dict[str, Any]:
        (c0, s0), (c1, s1) = self.began, await self.probe.cycles()
        cycles = int(c1 - c0)
        return {"cycles": cycles, "cycle_mean_ms": round(1000 * (s1 - s0) / cycles, 2) if cycles else None}


async def phase_throughput(bus: Bus, watch: Watch, probe: Probe, n: int, tag: str, meter: CpuMeter) -> dict[str, Any]:
    cmds = [submission(f"{tag}-{i:05d}") for i in range(n)]
    outs = [outgoing(c) for c in cmds]
    jobs = {c.job_id for c in cmds}
    await watch.reset(jobs)
    meter.start()
    GC.start()
    cycles = await Cycles(probe).start()
    t0 = time.perf_counter_ns()
    futures = [await bus.js.publish_async(o.subject, o.body, headers=o.headers) for o in outs]
    await asyncio.wait_for(asyncio.gather(*futures), timeout=PHASE_TIMEOUT_S)
    t_published = time.perf_counter_ns()
    complete = await watch.wait(PHASE_TIMEOUT_S)
    await asyncio.sleep(0.2)  # the last grants' trailing messages, for the counts
    machine = {**meter.stop(), **GC.stop()}
    done = [watch.scheduled[j] for j in jobs if j in watch.scheduled]
    span = (max(done) - t0) if done else 0
    return {
        "n": n,
        "scheduled": len(done),
        "complete": complete,
        "publish_s": round((t_published - t0) / 1e9, 3),
        "span_s": round(span / 1e9, 3),
        "jobs_per_s": round(len(done) / (span / 1e9), 1) if span > 0 else float("nan"),
        **(await watch.finish(n)),
        **(await cycles.stop()),
        **machine,
    }


async def phase_latency(
    bus: Bus, watch: Watch, probe: Probe, n: int, rate: float, tag: str, meter: CpuMeter, stages: bool
) -> dict[str, Any]:
    cmds = [submission(f"{tag}-{i:05d}") for i in range(n)]
    await watch.reset({c.job_id for c in cmds}, granted=True, stages=stages)
    meter.start()
    GC.start()
    cycles = await Cycles(probe).start()
    sent, offered_s = await publish_paced(bus, cmds, rate)
    complete = await watch.wait(PHASE_TIMEOUT_S)
    await asyncio.sleep(0.2)
    machine = {**meter.stop(), **GC.stop()}
    lat_ms = sorted((watch.scheduled[j] - t) / 1e6 for j, t in sent.items() if j in watch.scheduled)
    granted = watch.seen_at[AllocationGranted]
    granted_ms = sorted((granted[j] - t) / 1e6 for j, t in sent.items() if j in granted)
    return {
        "n": n,
        "offered_per_s": rate,
        "achieved_offer_per_s": round(n / offered_s, 1) if offered_s > 0 else float("nan"),
        "scheduled": len(lat_ms),
        "complete": complete,
        "p50_ms": round(pct(lat_ms, 50), 3),
        "p99_ms": round(pct(lat_ms, 99), 3),
        "max_ms": round(pct(lat_ms, 100), 3),
        "granted": len(granted_ms),
        "granted_p50_ms": round(pct(granted_ms, 50), 3),
        "granted_p99_ms": round(pct(granted_ms, 99), 3),
        "granted_max_ms": round(pct(granted_ms, 100), 3),
        "stages_ms": watch.stages_ms(sent) if stages else None,
        **(await watch.finish(n)),
        **(await cycles.stop()),
        **machine,
    }


def _scheduler_config(args: argparse.Namespace) -> dict[str, Any]:
    """The scheduler's settings in this bench (either way it runs)."""
    tuning: dict[str, Any] = {} if args.debounce is None else {"cycle_debounce_s": args.debounce}
    if args.cycle_takes is not None:
        tuning["cycle_takes_news"] = [n for n in args.cycle_takes.split(",") if n]
    return {
        "policy": "fifo",
        "log_level": "warning",
        "placement": args.placement,
        "batch_proposals": args.batch == "on",
        **tuning,
    }


async def in_process(
    stack: AsyncExitStack, args: argparse.Namespace, bus: Bus, dsn: str
) -> tuple[InProcess, dict[str, int]]:
    """The allocator and the scheduler as Services in this process; stopped when `stack` closes."""
    stores: list[Store] = []
    for schema in ("bench_pool", "bench_sched"):
        store = await Store.connect(dsn, schema)
        stack.push_async_callback(store.close)
        await store.migrate()
        stores.append(store)
    acfg = PoolAllocatorConfig(instance="bench", durable_prefix="pool-allocator-bench", log_level="warning")
    akit = Kit(name="pool_allocator", config=acfg, bus=bus, store=stores[0], metrics=ServiceMetrics("pa"))
    scfg = SchedulerConfig(instance="bench", durable_prefix="scheduler-bench", **_scheduler_config(args))
    skit = Kit(name="scheduler", config=scfg, bus=bus, store=stores[1], metrics=ServiceMetrics("scheduler"))
    spec = await scheduler_bootstrap(skit)
    sched: Scheduler = spec.tasks[0].__self__  # type: ignore[attr-defined]
    for service in (Service(akit, await allocator_bootstrap(akit)), Service(skit, spec)):
        await service.start()
        stack.push_async_callback(_stop_service, service)
    return InProcess(sched), {}


async def _stop_service(service: Service[Any]) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(service.stop(), timeout=30)


def _warnings(log: Path) -> list[str]:
    """The lines of a service's log at level warning or above, but the expected ones of a stop."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [
        line
        for line in lines
        if ('"level": "warning"' in line or '"level": "error"' in line) and '"why": "resigned"' not in line
    ]


async def own_processes(
    stack: AsyncExitStack, args: argparse.Namespace, nats_url: str, dsn: str
) -> tuple[OwnProcesses, dict[str, int]]:
    """The allocator and the scheduler each as its own process (logs in a temp dir, kept on failure
    only); SIGTERM and waited for when `stack` closes."""
    logs = Path(tempfile.mkdtemp(prefix="ibpool-bench-sched-logs-"))
    base = dict(os.environ, IBPOOL_NATS_URL=nats_url, IBPOOL_POSTGRES_DSN=dsn)
    settings = {
        k.upper(): str(v).lower() if isinstance(v, bool) else json.dumps(v) if isinstance(v, list) else str(v)
        for k, v in _scheduler_config(args).items()
    }
    procs = [
        ServiceProcess.of("pool_allocator", base, logs, instance="bench", LOG_LEVEL="warning"),
        ServiceProcess.of("scheduler", base, logs, instance="bench", **settings),
    ]

    def stop_all() -> None:
        for p in procs:
            p.terminate()
        codes = [p.wait(30) for p in procs]
        # What the services warned of (a replica's replay, a failed cycle) explains a slow phase.
        warned = [f"{p.name}: {line.strip()}" for p in procs for line in _warnings(p.log_path)]
        for line in warned[:20]:
            print(line, flush=True)
        if all(c == 0 for c in codes) and not warned:
            shutil.rmtree(logs, ignore_errors=True)
        else:
            print(f"services ended with {codes}, {len(warned)} warnings; their logs are in {logs}", flush=True)

    stack.callback(stop_all)
    for p in procs:
        p.start()
    http = await stack.enter_async_context(aiohttp.ClientSession())
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    for p in procs:
        while not await p.ready(http):
            if not p.running() or time.monotonic() > deadline:
                raise RuntimeError(f"{p.name} did not start; its log: {p.log_path}")
            await asyncio.sleep(0.2)
    allocator, scheduler = procs
    pids = {p.name: p.proc.pid for p in procs if p.proc is not None}
    return OwnProcesses(http, scheduler.url, allocator.url), pids


async def bench(args: argparse.Namespace, nats_url: str, dsn: str, pids: dict[str, int]) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        bus = await Bus.connect(nats_url, name="bench-sched")
        stack.push_async_callback(_close, bus.close())
        await bus.ensure_streams()
        if args.services == "inproc":
            probe, service_pids = await in_process(stack, args, bus, dsn)
        else:
            probe, service_pids = await own_processes(stack, args, nats_url, dsn)

        sub_nc = await nats.connect(nats_url, name="bench-sched-sub", connect_timeout=5)
        stack.push_async_callback(_close, sub_nc.close())
        watch = Watch(sub_nc, bus.js)
        await watch.start()

        nodes = [f"bn{i:04d}" for i in range(args.nodes)]
        t = time.perf_counter()
        await bus.publish_batch([outgoing(registered(n, args.gpus)) for n in nodes], timeout_s=60)
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while not await probe.leading_with(len(nodes)):
            if time.monotonic() > deadline:
                raise RuntimeError("the scheduler did not lead with every node in time")
            await asyncio.sleep(0.2)
        print(f"registered {len(nodes)} nodes x {args.gpus} GPUs in {time.perf_counter() - t:.1f} s", flush=True)

        if args.gc_freeze:
            freeze_startup_heap()  # as every service does once it is wired (ibpool_runtime.service)
        profile = cProfile.Profile() if args.profile else None
        runs = []
        meter = CpuMeter({**pids, **service_pids})
        for r in range(args.runs):
            if profile is not None:
                profile.enable()
            tp = await phase_throughput(bus, watch, probe, args.n, f"tp{r}", meter)
            if profile is not None:
                profile.disable()
            print(f"run {r + 1} throughput: {tp}", flush=True)
            await drain(bus, probe, [f"tp{r}-{i:05d}" for i in range(args.n)])
            run: dict[str, Any] = {"throughput": tp}
            for rate in args.rates:
                tag = f"lat{rate:g}r{r}"
                lat = await phase_latency(bus, watch, probe, args.lat_n, rate, tag, meter, args.stages)
                print(f"run {r + 1} latency at {rate:g}/s: {lat}", flush=True)
                await drain(bus, probe, [f"{tag}-{i:05d}" for i in range(args.lat_n)])
                run[f"latency_{rate:g}"] = lat
            runs.append(run)
        if profile is not None:
            pstats.Stats(profile).sort_stats("cumulative").print_stats(args.profile)
        return {"runs": runs}


async def _close(closing: Any) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(closing, timeout=5)


def cycle_only(args: argparse.Namespace) -> dict[str, Any]:
    """The scheduler's decision alone, no bus or store: `plan_cycle` as the service calls it (a
    `Scheduler` of the bench's config: its policy, cycle config, placement framework, plan cache and
    placement inputs) on a ledger of --nodes x --gpus. Each of --cycles cycles gets --cycle-jobs new
    1-GPU jobs; a cycle's proposals are granted on the ledger --grant-delay cycles later (in flight
    until then), as the allocator would. Times the cycles only (process CPU and wall)."""
    from ibpool_core.pool import allocate as al
    from ibpool_core.pool.ledger import Ledger
    from ibpool_core.sched import records as job_states
    from ibpool_core.sched.pool_cycle import ProposalStamp, job_changes, plan_cycle
    from ibpool_core.sched.records import JobRecord
    from ibpool_runtime.clock import SystemClock
    from ibpool_scheduler.state import tally_of

    cfg = SchedulerConfig(instance="bench", policy="fifo", log_level="warning", placement=args.placement)
    kit = Kit(name="scheduler", config=cfg, bus=None, store=None, metrics=ServiceMetrics("cycle"))  # type: ignore[arg-type]
    sched = Scheduler(kit, SystemClock())
    t0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
    ledger = Ledger()
    for i in range(args.nodes):
        al.handle(ledger, registered(f"bn{i:04d}", args.gpus), t0)
    live: dict[str, JobRecord] = {}
    pending: list[tuple[int, str, ProposePlacement]] = []
    stamp = ProposalStamp(source="bench", group=sched.group, lease_s=cfg.lease_s)
    cpu = wall = 0.0
    GC.start()
    for c in range(args.cycles):
        now = t0 + dt.timedelta(seconds=10 + 0.05 * c)
        for k in range(args.cycle_jobs):
            job_id = f"c{c:04d}-{k:03d}"
            live[job_id] = JobRecord(job_id=job_id, tenant="bench", queue="bench", submitted_at=now, queued_at=now)
        records = list(live.values())
        c0, w0 = time.process_time(), time.perf_counter()
        plan = plan_cycle(
            ledger,
            records,
            now,
            sched.policy,
            sched.cycle_config,
            cfg.leaf_label,
            sched.plan_cache,
            placement=sched.placement_inputs(tally_of(records), now),
            queue_rules=sched.queue_rules,
        )
        cpu += time.process_time() - c0
        wall += time.perf_counter() - w0
        # What the service writes for the plan (waits and proposals), as its cycle does.
        for job_id, (_, written, commands) in job_changes(plan, live, now, sched.lifecycle, stamp).items():
            live[job_id] = written
            pending.extend((c + args.grant_delay, job_id, cmd) for cmd in commands if isinstance(cmd, ProposePlacement))
        while pending and pending[0][0] <= c:
            _, job_id, cmd = pending.pop(0)
            al.handle(ledger, cmd, now)
            live[job_id] = job_states.granted(live[job_id], cmd.id, sorted({a.node_id for a in cmd.assignments}), now)
    placed = sum(1 for j in live.values() if j.state != "queued")
    return {
        "cycles": args.cycles,
        "jobs_per_cycle": args.cycle_jobs,
        "grant_delay_cycles": args.grant_delay,
        "placed": placed,
        "cycle_cpu_ms": round(1000 * cpu / args.cycles, 3),
        "cycle_wall_ms": round(1000 * wall / args.cycles, 3),
        "cpu_ms_per_job": round(1000 * cpu / max(placed, 1), 4),
        **GC.stop(),
    }


def on_stack(args: argparse.Namespace, sync_always: bool) -> dict[str, Any]:
    """Run the bench on a fresh embedded stack (nats-server `sync_interval: always` or its default)."""
    with devstack.servers("ibpool-bench-sched-", sync_always=sync_always) as stack:
        return asyncio.run(bench(args, stack.nats_url, stack.postgres_dsn, stack.pids))


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs; the latency floor is judged at the offered rate of the throughput floor."""

    def med(phase: str, key: str) -> float:
        return round(statistics.median(float(r[phase][key]) for r in runs), 3)

    phases = list(runs[0])
    jobs_per_s = med("throughput", "jobs_per_s")
    all_scheduled = all(r[p]["scheduled"] == r[p]["n"] for r in runs for p in phases)
    n = runs[0]["throughput"]["n"]
    cpu_ms_per_job: dict[str, float | None] = {}
    for name in runs[0]["throughput"]["cpu_s"]:
        spent = [r["throughput"]["cpu_s"][name] for r in runs]
        cpu_ms_per_job[name] = None if None in spent else round(statistics.median(1000 * c / n for c in spent), 3)
    gc_ms_per_job = round(statistics.median(1000 * r["throughput"]["gc_s"] / n for r in runs), 3)
    latency = {
        p: {
            "offered_per_s": runs[0][p]["offered_per_s"],
            "p50_ms": med(p, "p50_ms"),
            "p99_ms": med(p, "p99_ms"),
            "max_ms": med(p, "max_ms"),
            "granted_p50_ms": med(p, "granted_p50_ms"),
            "granted_p99_ms": med(p, "granted_p99_ms"),
            "stages_ms_first_run": runs[0][p]["stages_ms"],
        }
        for p in phases
        if p.startswith("latency_")
    }
    at_floor = next((v for v in latency.values() if v["offered_per_s"] == FLOOR_JOBS_PER_S), None)
    return {
        "jobs_per_s": jobs_per_s,
        "throughput_span_s": med("throughput", "span_s"),
        "throughput_cpu_ms_per_job": cpu_ms_per_job,
        "throughput_gc_ms_per_job": gc_ms_per_job,
        "messages_per_job": med("throughput", "messages_per_job"),
        "messages_per_job_by_stream": runs[0]["throughput"]["messages_per_job_by_stream"],
        "throughput_cycles": [r["throughput"]["cycles"] for r in runs],
        "throughput_cycle_mean_ms": [r["throughput"]["cycle_mean_ms"] for r in runs],
        "load_1m_at_start": {p: [r[p]["load_1m_at_start"] for r in runs] for p in phases},
        "steal_s": {p: [r[p].get("steal_s") for r in runs] for p in phases},
        "latency": latency,
        "every_job_scheduled": all_scheduled,
        "floor_jobs_per_s": FLOOR_JOBS_PER_S,
        "floor_p99_ms": FLOOR_P99_MS,
        "pass_throughput": jobs_per_s >= FLOOR_JOBS_PER_S and all_scheduled,
        # The measure: submit -> granted (AllocationGranted); submit -> JobScheduled beside it.
        "pass_latency": None if at_floor is None else at_floor["granted_p99_ms"] < FLOOR_P99_MS and all_scheduled,
        "pass_latency_to_scheduled": None if at_floor is None else at_floor["p99_ms"] < FLOOR_P99_MS and all_scheduled,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, default=2000, help="jobs in the throughput phase")
    ap.add_argument("--lat-n", type=int, default=1000, help="jobs in the latency phase")
    ap.add_argument(
        "--rates",
        type=lambda v: [float(x) for x in v.split(",")],
        default=[150.0, 300.0],
        help="offered rates of the latency phases, per s, comma-separated (300: the floor's)",
    )
    ap.add_argument("--debounce", type=float, default=None, help="the scheduler's cycle_debounce_s (default: its own)")
    ap.add_argument(
        "--cycle-takes",
        default=None,
        help="the scheduler's cycle_takes_news, comma-separated (jobs, pool, health; empty: none): the"
        " consumers whose news the leader's cycle handles in its own transaction (default: its own setting)",
    )
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--sync", choices=("both", "always", "default"), default="both", help="nats-server fsync")
    ap.add_argument("--placement", choices=("framework", "leaf"), default="framework", help="the scheduler's placement")
    ap.add_argument("--batch", choices=("on", "off"), default="on", help="one ProposePlacements per cycle, or one each")
    ap.add_argument(
        "--services",
        choices=("process", "inproc"),
        default="process",
        help="the scheduler and the allocator each as its own process, or both in the benchmark process",
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        help="cProfile the throughput phases (with --services inproc); rows to print",
    )
    ap.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="leave the start-up heap to the garbage collector (every service freezes it once wired)",
    )
    ap.add_argument(
        "--no-stages",
        dest="stages",
        action="store_false",
        help="time the grant and JobScheduled only: no subscriptions to JobQueued and the proposals, whose"
        " deliveries and decoding load the cores the services run on",
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_sched-latest.json")
    ap.add_argument("--cycle-only", action="store_true", help="time the scheduling cycle alone (see cycle_only)")
    ap.add_argument("--cycles", type=int, default=100, help="--cycle-only: cycles")
    ap.add_argument("--cycle-jobs", type=int, default=20, help="--cycle-only: new 1-GPU jobs per cycle")
    ap.add_argument("--grant-delay", type=int, default=5, help="--cycle-only: cycles a proposal waits for its grant")
    args = ap.parse_args()
    if args.profile and args.services != "inproc":
        ap.error("--profile profiles this process: use it with --services inproc")
    if max(args.n, args.lat_n) > args.nodes * args.gpus:
        ap.error("a phase needs at most one job per GPU")
    configure_logging("bench", "warning")
    if args.cycle_only:
        if args.cycles * args.cycle_jobs > args.nodes * args.gpus:
            ap.error("--cycle-only needs at most one job per GPU (--cycles x --cycle-jobs)")
        found = cycle_only(args)
        print(json.dumps(found))
        if args.out != RESULTS / "bench_sched-latest.json":
            args.out.write_text(
                json.dumps({"bench": "bench_sched --cycle-only", "placement": args.placement, **found}) + "\n"
            )
        return 0

    settings = {"always": True, "default": False}
    chosen = list(settings) if args.sync == "both" else [args.sync]
    results: dict[str, Any] = {}
    for name in chosen:
        print(f"--- nats sync {name}", flush=True)
        runs = on_stack(args, settings[name])["runs"]
        results[f"sync_{name}"] = {"summary": summarise(runs), "runs": runs}
    doc = {
        "bench": "bench_sched",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "settings": {
            "runs": args.runs,
            "throughput_n": args.n,
            "latency_n": args.lat_n,
            "latency_rates_per_s": args.rates,
            "nodes": args.nodes,
            "gpus_per_node": args.gpus,
            "job": "1 whole GPU, policy fifo, backfill easy",
            "cycle_debounce_s": args.debounce,
            "cycle_takes_news": args.cycle_takes,
            "placement": args.placement,
            "batch_proposals": args.batch == "on",
            "postgres_fsync": True,
            "gc_freeze": args.gc_freeze,
            "services": args.services,
            "stage_subscriptions": args.stages,
        },
        **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: v["summary"] for k, v in results.items()}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
