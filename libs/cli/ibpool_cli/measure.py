"""What a run costs, measured from outside the services: `ibpool run --measure FILE`.

Per process (each service, nats-server, PostgreSQL with its backends): CPU seconds over the whole
run and over its steady part (from when every node was registered to the end of the workload), and
peak resident memory, sampled every second with psutil. From the bus: events per second by type.
From the servers: JetStream bytes per stream and Postgres rows and bytes per schema, at the start
of the steady part and at its end, so that growth per hour can be told from the set-up.

`bench_scale.py` runs `ibpool run --measure` at several sizes and turns the files into the table
and curves of docs/scale.md.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import asyncpg
import msgspec
import psutil
from nats.js import JetStreamContext
from prometheus_client.parser import text_string_to_metric_families

from ibpool_runtime.streams import STREAMS


class ProcessCost(msgspec.Struct, kw_only=True):
    cpu_s: float
    steady_cpu_s: float
    peak_rss_mib: float


class StoreSize(msgspec.Struct, kw_only=True):
    rows: int
    bytes: int


class Measured(msgspec.Struct, kw_only=True):
    """One run's costs (`ibpool run --measure`)."""

    nodes: int
    gpus: int
    duration_s: float
    steady_s: float
    processes: dict[str, ProcessCost]
    events_per_s: dict[str, float]
    # At the start of the steady part and at its end: per stream, per schema.
    stream_bytes: dict[str, tuple[int, int]]
    postgres: dict[str, tuple[StoreSize, StoreSize]]
    # Seconds: the scheduler's cycle (from its histogram's buckets: an upper bound), a job's
    # JobQueued -> JobScheduled on the bus, the spare's SIGKILL -> NodeFailed.
    cycle_p50_s: float | None
    cycle_p99_s: float | None
    queued_to_scheduled_p50_s: float | None
    queued_to_scheduled_p99_s: float | None
    kill_to_failed_s: float | None
    summary_ok: bool


def _tree(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    return []


def _cpu(procs: Iterable[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def _rss_mib(procs: Iterable[psutil.Process]) -> float:
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total / 2**20


@dataclass
class ProcessMeter:
    """CPU and peak RSS of named process trees (a postmaster and its backends count as one); a name
    whose process is replaced (an agent killed and started again) adds up over its processes."""

    cpu: dict[tuple[str, int], float] = field(default_factory=dict)
    steady_from: dict[str, float] = field(default_factory=dict)
    peak: dict[str, float] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)

    def sample(self, pids: dict[str, int]) -> None:
        for name, pid in pids.items():
            if name not in self.names:
                self.names.append(name)
            procs = _tree(pid)
            if not procs:
                continue  # ended: its last sample stands
            self.cpu[(name, pid)] = max(self.cpu.get((name, pid), 0.0), _cpu(procs))
            self.peak[name] = max(self.peak.get(name, 0.0), _rss_mib(procs))

    def cpu_of(self, name: str) -> float:
        return sum(v for (n, _), v in self.cpu.items() if n == name)

    def steady_starts(self, pids: dict[str, int]) -> None:
        self.sample(pids)
        self.steady_from = {name: self.cpu_of(name) for name in self.names}

    def costs(self) -> dict[str, ProcessCost]:
        return {
            name: ProcessCost(
                cpu_s=round(self.cpu_of(name), 2),
                steady_cpu_s=round(self.cpu_of(name) - self.steady_from.get(name, 0.0), 2),
                peak_rss_mib=round(self.peak.get(name, 0.0), 1),
            )
            for name in self.names
        }


async def stream_bytes(js: JetStreamContext) -> dict[str, int]:
    out = {}
    for spec in STREAMS:
        with contextlib.suppress(Exception):
            out[spec.name] = int((await js.stream_info(spec.name)).state.bytes)
    return out


async def postgres_sizes(dsn: str) -> dict[str, StoreSize]:
    """Live rows and bytes (tables, indexes, TOAST) per schema of the services."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT schemaname, sum(n_live_tup)::bigint AS rows, sum(pg_total_relation_size(relid))::bigint AS bytes"
            " FROM pg_stat_user_tables GROUP BY schemaname ORDER BY schemaname"
        )
    finally:
        await conn.close()
    return {r["schemaname"]: StoreSize(rows=int(r["rows"] or 0), bytes=int(r["bytes"] or 0)) for r in rows}


def histogram_quantile(metrics_text: str, name: str, q: float) -> float | None:
    """The upper bound of the bucket holding the q-quantile of histogram `name` (None: no samples)."""
    for family in text_string_to_metric_families(metrics_text):
        if family.name != name:
            continue
        buckets = sorted(
            (float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket") and "le" in s.labels
        )
        if not buckets or buckets[-1][1] == 0:
            return None
        want = q * buckets[-1][1]
        return next(le for le, count in buckets if count >= want)
    return None


def quantiles(values: Sequence[float]) -> tuple[float | None, float | None]:
    """p50 and p99 (nearest rank) of `values`; (None, None) when there are none."""
    if not values:
        return None, None
    ordered = sorted(values)
    p99 = ordered[max(0, min(len(ordered) - 1, -(-99 * len(ordered) // 100) - 1))]
    return round(statistics.median(ordered), 3), round(p99, 3)
