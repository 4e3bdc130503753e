"""Bus benchmark: raw JetStream vs ibpool's outbox relay vs ibpool's consumer, on the embedded stack.

`make bench` runs `bench_bus.py --runs 5`. Each run measures, for N messages with a 256-byte body,
once with nats-server `sync_interval: always` (production) and once with the default fsync:

  core       core NATS publish + flush, no JetStream (orientation only)
  raw        nats-py `publish_async` into the IBPOOL_NODE stream, in-flight window 256, every ack awaited
  outbox_1   ibpool's path: producers commit 1 event per transaction (Store.transaction + tx.outbox)
             while an OutboxRelay publishes; latency = commit -> stored in the stream
  outbox_100 the same with 100 events per transaction
  e2e        a separate process publishes at the raw rate (publish_async, window 256, ibpool headers);
             ibpool's Consumer (durable pull, decode, one Postgres transaction per batch with inbox
             rows, ack) runs a handler that inserts one row; latency = publish -> inbox commit
             (at the raw rate the consumer falls behind, so this latency is mostly queueing)
  e2e_paced  the same path offered a fixed 400 msgs/s (1000 messages): the latency without a backlog

Postgres comes from devstack.start_postgres with fsync on (its real setting). Every figure is the
median over the runs; ratios are taken against raw of the same run and the same nats setting.
Results go to tests/bench/results/bench_bus-<UTC date>.json and latest.json.

Other modes (not part of `make bench`):
  --candidates     also measures runtime changes prototyped in this file, labelled `candidate_*`
                   (never ibpool's number), plus raw_ibpool_headers (raw with ibpool's 8 headers)
  --micro-commit   the commit path alone (1-event outbox transactions, no relay), ibpool's pool
                   vs a pool without asyncpg's per-release reset query
  --profile relay|relay1|consumer [--profiler cprofile|pyinstrument]
                   profiles one path (pyinstrument is not a dependency; install it yourself)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import hashlib
import importlib.metadata
import json
import math
import multiprocessing
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import nats
import nats.errors
from bench_cpu import machine_busy_s, tree_cpu_s
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from opentelemetry import context as otel_context
from opentelemetry import trace

from ibpool_proto import DecodeError, decode, encode
from ibpool_proto.node import NodeRegistered
from ibpool_runtime import consumer as ibpool_consumer
from ibpool_runtime import devstack, telemetry
from ibpool_runtime.bus import Bus, OutgoingMessage, outgoing
from ibpool_runtime.consumer import Consumer, ConsumerSettings, HandlerContext, Subscription
from ibpool_runtime.logs import configure_logging
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.outbox import OutboxRelay
from ibpool_runtime.store import Store, Transaction

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULTS = HERE / "results"
STREAM = "IBPOOL_NODE"
# Registrations stand for any small stored event (heartbeats, which this bench used until 2026-12-05,
# are no longer stored: core NATS only); the body is padded to PAYLOAD_BYTES either way.
SUBJECT_FILTER = NodeRegistered.subject_pattern()  # ibpool.node.node.registered.*
CORE_SUBJECT = "bench.core.orientation"  # no stream captures it, nobody subscribes
PAYLOAD_BYTES = 256
NODES = 64
PHASE_TIMEOUT_S = 120.0
SETTINGS = {"sync_always": True, "sync_default": False}
RUNTIME_FILES = ("bus.py", "store.py", "outbox.py", "consumer.py", "telemetry.py")

STATE_SQL = (
    "CREATE TABLE IF NOT EXISTS bench_state (event_id text PRIMARY KEY, node_id text NOT NULL, seq bigint NOT NULL)"
)


# ---------------------------------------------------------------- messages


def _heartbeat(i: int, source: str) -> NodeRegistered:
    node = f"n{i % NODES:04d}"
    # The message's sequence number rides in cpu_milli (see `seq_of`), with a fixed digit count so
    # every body has the same length.
    return NodeRegistered(
        source=source, key=node, node_id=node, hostname=node, cpu_milli=100_000 + i, memory_mib=1, gpus=[], backend="b"
    )


def seq_of(event: Any) -> int:
    """The bench's sequence number of a message (`_heartbeat`)."""
    return int(event.cpu_milli)


def _padded_source() -> str:
    """A `source` long enough that an encoded heartbeat is PAYLOAD_BYTES long."""
    base = "bench/"
    short = len(encode(_heartbeat(0, base)))
    return base + "x" * max(0, PAYLOAD_BYTES - short)


SOURCE = _padded_source()


def make_messages(n: int) -> list[NodeRegistered]:
    return [_heartbeat(i, SOURCE) for i in range(n)]


# ---------------------------------------------------------------- stats


def pct(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return float(sorted_values[k])


def lat_summary(lat_ns: Sequence[int]) -> dict[str, float]:
    ms = sorted(v / 1e6 for v in lat_ns)
    return {
        "p50_ms": round(pct(ms, 50), 3),
        "p99_ms": round(pct(ms, 99), 3),
        "max_ms": round(pct(ms, 100), 3),
    }


def rate(n: int, span_ns: int) -> float:
    return round(n / (span_ns / 1e9), 1) if span_ns > 0 else float("nan")


# ---------------------------------------------------------------- CPU accounting


def _self_cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


class CpuMeter:
    """CPU seconds spent over a measured window by this process, nats-server, Postgres (postmaster,
    its live backends and the ones it reaped: `bench_cpu.tree_cpu_s`) and the whole machine, which
    includes whatever else runs on it (`others_s`). Linux /proc only; empty elsewhere."""

    def __init__(self) -> None:
        self.nats_pid = 0
        self.pg_pid = 0

    def snap(self) -> dict[str, float]:
        nats_s, pg_s, busy_s = tree_cpu_s(self.nats_pid), tree_cpu_s(self.pg_pid), machine_busy_s()
        if nats_s is None or pg_s is None or busy_s is None:
            return {}
        return {
            "bench": _self_cpu(),
            "nats": nats_s,
            "postgres": pg_s,
            "machine_busy": busy_s,
            "wall": time.monotonic(),
        }

    @staticmethod
    def diff(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        if not before or not after:
            return {}
        d = {f"{k}_s": round(after[k] - before[k], 3) for k in before}
        wall = d.pop("wall_s")
        d["wall_s"] = round(wall, 3)
        ncpu = os.cpu_count() or 1
        d["machine_util_pct"] = round(100 * d["machine_busy_s"] / (wall * ncpu), 1) if wall > 0 else 0.0
        d["others_s"] = round(d["machine_busy_s"] - d["bench_s"] - d["nats_s"] - d["postgres_s"], 3)
        return d


CPU = CpuMeter()


# ---------------------------------------------------------------- stack


class Stack:
    """One Postgres (fsync on) and one nats-server per setting, all started by us and stopped by us."""

    def __init__(self, root: Path, settings: Sequence[str]) -> None:
        self.root = root
        self.settings = list(settings)
        self.nats: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        self.pg_data: Path | None = None
        self.pg_pid = 0
        self.dsn = ""

    def start(self) -> None:
        for name in self.settings:
            d = self.root / name
            d.mkdir(parents=True, exist_ok=True)
            proc, url, _monitor = devstack.start_nats(d, sync_always=SETTINGS[name])
            self.nats[name] = (proc, url)
        pg_dir = self.root / "pg"
        pg_dir.mkdir(parents=True, exist_ok=True)
        # Set before starting so that a failed start (left half-running) is still stopped.
        self.pg_data = pg_dir / "pgdata"
        try:
            self.pg_pid, self.dsn, self.pg_data = devstack.start_postgres(pg_dir, fsync=True)
        except devstack.StackError:
            # seen once on this shared machine (initdb: permission denied); one retry, fresh dir
            pg_dir = self.root / "pg2"
            pg_dir.mkdir(parents=True, exist_ok=True)
            self.pg_data = pg_dir / "pgdata"
            self.pg_pid, self.dsn, self.pg_data = devstack.start_postgres(pg_dir, fsync=True)

    def stop(self) -> None:
        if self.pg_data is not None:
            with contextlib.suppress(Exception):
                devstack.stop_postgres(self.pg_data)
        for proc, _url in self.nats.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


# ---------------------------------------------------------------- helpers


async def connect_js(url: str, window: int) -> tuple[Any, Any]:
    nc = await nats.connect(url, name="bench-raw", connect_timeout=5)
    return nc, nc.jetstream(publish_async_max_pending=window)


async def reset_stream(js: Any) -> None:
    await js.purge_stream(STREAM)


async def read_stream(js: Any, n: int, timeout_s: float = 30.0) -> list[tuple[int, int, str]]:
    """(stream seq, stored timestamp ns, Nats-Msg-Id) of the first n messages of the stream.

    The timestamp is the one JetStream stored the message with (carried in the ack reply subject).
    """
    durable = "bench_readback"
    with contextlib.suppress(Exception):
        await js.delete_consumer(STREAM, durable)
    await js.add_consumer(
        STREAM,
        ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.ALL,
            filter_subject=SUBJECT_FILTER,
        ),
    )
    out: list[tuple[int, int, str]] = []
    deadline = time.monotonic() + timeout_s
    try:
        psub = await js.pull_subscribe_bind(durable, stream=STREAM)
        while len(out) < n and time.monotonic() < deadline:
            try:
                msgs = await psub.fetch(min(1000, n - len(out)), timeout=1.0)
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            for m in msgs:
                md = m.metadata
                ts_ns = _stored_ts_ns(m.reply) or int(md.timestamp.timestamp() * 1e9)
                out.append((md.sequence.stream, ts_ns, (m.headers or {}).get("Nats-Msg-Id", "")))
        await psub.unsubscribe()
    finally:
        with contextlib.suppress(Exception):
            await js.delete_consumer(STREAM, durable)
    if len(out) < n:
        raise RuntimeError(f"read back only {len(out)} of {n} messages from {STREAM}")
    return out


def _stored_ts_ns(reply: str | None) -> int | None:
    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>  (v1, 9 tokens)
    # $JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<rand>]  (v2)
    if not reply:
        return None
    t = reply.split(".")
    try:
        return int(t[7]) if len(t) == 9 else int(t[9])
    except (IndexError, ValueError):
        return None


async def fresh_store(dsn: str, schema: str, store_cls: type[Store] = Store) -> Store:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()
    store = await store_cls.connect(dsn, schema)
    await store.migrate()
    await store.pool.execute(STATE_SQL)
    # Open every pooled connection now, so that no connect lands inside a measurement.
    await asyncio.gather(*(store.pool.fetchval("SELECT pg_sleep(0.01)") for _ in range(store.pool.get_max_size())))
    return store


async def drop_store(store: Store, dsn: str) -> None:
    schema = store.schema
    await store.close()
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def warm_bus(bus: Bus) -> None:
    """One publish_async round trip so the reply subscription exists before timing; then purge."""
    m = _heartbeat(999_999, SOURCE)
    await bus.publish_batch([outgoing(m)])
    await reset_stream(bus.js)


def clear_spans() -> None:
    mem = telemetry.memory_exporter()
    if mem is not None:
        mem.clear()


# ---------------------------------------------------------------- (0) core NATS


async def bench_core(url: str, n: int) -> dict[str, Any]:
    nc = await nats.connect(url, name="bench-core", connect_timeout=5)
    try:
        body = encode(make_messages(1)[0])
        await nc.flush()
        c0 = CPU.snap()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            await nc.publish(CORE_SUBJECT, body)
        await nc.flush(timeout=30)
        t1 = time.perf_counter_ns()
        cpu = CpuMeter.diff(c0, CPU.snap())
    finally:
        await nc.close()
    return {"n": n, "msgs_per_s": rate(n, t1 - t0), "cpu": cpu}


# ---------------------------------------------------------------- (a) raw JetStream


async def bench_raw(url: str, n: int, window: int, *, with_headers: bool = False) -> dict[str, Any]:
    nc, js = await connect_js(url, window)
    try:
        msgs = make_messages(n)
        outs = [outgoing(m) for m in msgs]
        subjects = [o.subject for o in outs]
        bodies = [o.body for o in outs]
        headers: list[dict[str, str] | None] = [o.headers for o in outs] if with_headers else [None] * n
        warm = await js.publish_async(subjects[0], bodies[0])
        await asyncio.wait_for(warm, 10)
        await reset_stream(js)

        pub_ns = [0] * n
        ack_ns = [0] * n
        futs = []

        def on_ack(i: int) -> Callable[[Any], None]:
            def cb(_f: Any) -> None:
                ack_ns[i] = time.time_ns()

            return cb

        c0 = CPU.snap()
        t0 = time.time_ns()
        for i in range(n):
            f = await js.publish_async(subjects[i], bodies[i], headers=headers[i])
            pub_ns[i] = time.time_ns()
            f.add_done_callback(on_ack(i))
            futs.append(f)
        acks = await asyncio.wait_for(asyncio.gather(*futs), PHASE_TIMEOUT_S)
        await asyncio.sleep(0)  # let the last done-callbacks run
        cpu = CpuMeter.diff(c0, CPU.snap())
        t1 = max(ack_ns)
        stored = {seq: ts for seq, ts, _ in await read_stream(js, n)}
        await reset_stream(js)
    finally:
        await nc.close()
    to_ack = [ack_ns[i] - pub_ns[i] for i in range(n)]
    to_stored = [stored[a.seq] - pub_ns[i] for i, a in enumerate(acks)]
    return {
        "n": n,
        "msgs_per_s": rate(n, t1 - t0),
        "latency": {"what": "publish_async returned -> ack received", **lat_summary(to_ack)},
        "latency_to_stored": {"what": "publish_async returned -> stored timestamp", **lat_summary(to_stored)},
        "duplicates": sum(1 for a in acks if a.duplicate),
        "cpu": cpu,
    }


# ---------------------------------------------------------------- (b) outbox relay


RelayFactory = Callable[[Store, Bus, int], Any]


def ibpool_relay(store: Store, bus: Bus, window: int) -> Any:
    return OutboxRelay(store, bus, window=window)


async def bench_outbox(
    url: str,
    dsn: str,
    n: int,
    window: int,
    *,
    per_tx: int,
    producers: int,
    relay_factory: RelayFactory = ibpool_relay,
    label: str = "outbox",
    pool_reset: bool = True,
) -> dict[str, Any]:
    bus = await Bus.connect(url, name="bench-relay", window=window, attempts=3)
    store = await fresh_store(dsn, f"bench_{label}_{per_tx}")
    if not pool_reset:
        await candidate_no_reset_pool(store, dsn)
    stop = asyncio.Event()
    relay_task: asyncio.Task[None] | None = None
    try:
        await warm_bus(bus)
        msgs = make_messages(n)
        chunks = [msgs[i : i + per_tx] for i in range(0, n, per_tx)]
        commit_ns: dict[str, int] = {}
        relay = relay_factory(store, bus, window)
        relay_task = asyncio.create_task(relay.run(stop), name="bench-relay")
        queue = list(reversed(chunks))

        async def producer() -> None:
            while queue:
                chunk = queue.pop()
                async with store.transaction() as tx:
                    await tx.outbox(*chunk)
                now = time.time_ns()
                for m in chunk:
                    commit_ns[m.id] = now

        c0 = CPU.snap()
        t_start = time.time_ns()
        prod = asyncio.gather(*(producer() for _ in range(producers)))
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        await asyncio.wait_for(prod, PHASE_TIMEOUT_S)
        t_committed = time.time_ns()
        while relay.published < n:
            if time.monotonic() > deadline or relay_task.done():
                raise RuntimeError(f"relay published {relay.published} of {n} in time")
            await asyncio.sleep(0.002)
        t_relay_done = time.time_ns()
        cpu = CpuMeter.diff(c0, CPU.snap())
        stop.set()
        store.outbox_committed().set()
        await asyncio.wait_for(relay_task, 10)
        rows = await read_stream(bus.js, n)
        await reset_stream(bus.js)
        left = await store.outbox_lag()
    finally:
        stop.set()
        if relay_task is not None and not relay_task.done():
            relay_task.cancel()
            await asyncio.wait([relay_task], timeout=5)  # never swallows our own cancellation
        await bus.close()
        await drop_store(store, dsn)
    stored = {mid: ts for _seq, ts, mid in rows}
    if len(stored) != n or set(stored) != set(commit_ns):
        raise RuntimeError(f"stream holds {len(stored)} distinct events, expected the {n} committed")
    seqs = [s for s, _, _ in rows]
    first_commit = min(commit_ns.values())
    last_stored = max(stored.values())
    lat = [stored[k] - commit_ns[k] for k in commit_ns]
    return {
        "n": n,
        "per_tx": per_tx,
        "producers": producers,
        "msgs_per_s": rate(n, last_stored - first_commit),
        "latency": {"what": "commit -> stored timestamp in the stream", **lat_summary(lat)},
        "commit_msgs_per_s": rate(n, t_committed - t_start),
        "relay_done_msgs_per_s": rate(n, t_relay_done - first_commit),
        "outbox_rows_left": left,
        "stream_seq_gaps": (max(seqs) - min(seqs) + 1) - len(seqs),
        "cpu": cpu,
    }


# ---------------------------------------------------------------- (c) end to end


class TimedStore(Store):
    """Store that stamps the commit time of each handled event (instrumentation, not a change).

    The consumer calls `store.transaction()` once per batch; after the commit returns we record
    the wall-clock time for every event id the handler put in that transaction.
    """

    def __init__(self, pool: asyncpg.Pool, schema: str) -> None:
        super().__init__(pool, schema)
        self.commit_ns: dict[str, int] = {}
        self.done = asyncio.Event()
        self.expect = 0

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        ids: list[str] = []
        async with super().transaction() as tx:
            tx.bench_ids = ids  # type: ignore[attr-defined]
            yield tx
        now = time.time_ns()
        for eid in ids:
            self.commit_ns[eid] = now
        if self.expect and len(self.commit_ns) >= self.expect:
            self.done.set()


async def state_handler(event: Any, ctx: HandlerContext) -> None:
    assert ctx.tx is not None
    await ctx.tx.conn.execute(
        "INSERT INTO bench_state (event_id, node_id, seq) VALUES ($1, $2, $3)",
        event.id,
        event.node_id,
        seq_of(event),
    )
    ctx.tx.bench_ids.append(event.id)  # type: ignore[attr-defined]


def _publisher_child(conn: Any, url: str, n: int, window: int, pace: float) -> None:
    """Separate process: publish n ibpool heartbeats with publish_async (window), report times.

    pace = 0: as fast as the window allows (the raw rate); pace > 0: that many messages per second.
    """

    async def main() -> None:
        nc = await nats.connect(url, name="bench-e2e-publisher", connect_timeout=5)
        try:
            js = nc.jetstream(publish_async_max_pending=window)
            outs: list[OutgoingMessage] = [outgoing(m) for m in make_messages(n)]
            ids = [o.headers["Nats-Msg-Id"] for o in outs]
            conn.send("ready")
            loop = asyncio.get_running_loop()
            go = await loop.run_in_executor(None, conn.recv)
            if go != "go":
                return
            cpu0 = _self_cpu()
            pub_ns = [0] * n
            futs = []
            start = time.monotonic()
            for i, o in enumerate(outs):
                if pace > 0:
                    ahead = start + i / pace - time.monotonic()
                    if ahead > 0:
                        await asyncio.sleep(ahead)
                futs.append(await js.publish_async(o.subject, o.body, headers=o.headers))
                pub_ns[i] = time.time_ns()
            await asyncio.wait_for(asyncio.gather(*futs), PHASE_TIMEOUT_S)
            acked_ns = time.time_ns()
            conn.send({"ids": ids, "pub_ns": pub_ns, "acked_ns": acked_ns, "cpu_s": _self_cpu() - cpu0})
        finally:
            await nc.close()

    asyncio.run(main())


class ConsumerFactory:
    def __call__(self, bus: Bus, store: Store, sub: Subscription, settings: ConsumerSettings) -> Consumer:
        return Consumer(bus, store, sub, settings, ServiceMetrics("bench"), source=SOURCE)


async def bench_e2e(
    url: str,
    dsn: str,
    n: int,
    window: int,
    *,
    consumer_factory: ConsumerFactory | None = None,
    label: str = "e2e",
    pace: float = 0.0,
) -> dict[str, Any]:
    consumer_factory = consumer_factory or ConsumerFactory()
    bus = await Bus.connect(url, name="bench-consumer", window=window, attempts=3)
    store = await fresh_store(dsn, f"bench_{label}", TimedStore)
    assert isinstance(store, TimedStore)
    store.expect = n
    ctx = multiprocessing.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=_publisher_child, args=(child_conn, url, n, window, pace), daemon=True)
    stop = asyncio.Event()
    task: asyncio.Task[None] | None = None
    durable = "bench_e2e"
    try:
        await reset_stream(bus.js)
        sub = Subscription(durable=durable, filter_subjects=(SUBJECT_FILTER,), handler=state_handler)
        consumer = consumer_factory(bus, store, sub, ConsumerSettings())
        await consumer.start()
        task = asyncio.create_task(consumer.run(stop), name="bench-consumer")
        child.start()
        loop = asyncio.get_running_loop()
        ready = await asyncio.wait_for(loop.run_in_executor(None, _recv_within, parent_conn, 60.0), 65)
        if ready != "ready":
            raise RuntimeError(f"publisher process did not get ready: {ready!r}")
        c0 = CPU.snap()
        parent_conn.send("go")
        await asyncio.wait_for(store.done.wait(), PHASE_TIMEOUT_S)
        report = await asyncio.wait_for(loop.run_in_executor(None, _recv_within, parent_conn, 30.0), 35)
        if not isinstance(report, dict):
            raise RuntimeError(f"publisher process failed: {report!r}")
        cpu = CpuMeter.diff(c0, CPU.snap())
        if cpu:
            cpu["publisher_s"] = round(report["cpu_s"], 3)  # the publisher process, go -> all acked
            cpu["others_s"] = round(cpu["others_s"] - cpu["publisher_s"], 3)
        stop.set()
        await asyncio.wait_for(task, 10)
        inbox = await store.pool.fetchval("SELECT count(*) FROM inbox")
        state_rows = await store.pool.fetchval("SELECT count(*) FROM bench_state")
    finally:
        stop.set()
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=5)  # never swallows our own cancellation
        if child.is_alive():
            child.terminate()
        child.join(10)
        with contextlib.suppress(Exception):
            await bus.js.delete_consumer(STREAM, durable)
        with contextlib.suppress(Exception):
            await reset_stream(bus.js)
        t_close = time.monotonic()
        await bus.close()
        close_s = time.monotonic() - t_close
        await drop_store(store, dsn)
        clear_spans()
    pub = dict(zip(report["ids"], report["pub_ns"], strict=True))
    if set(pub) != set(store.commit_ns) or inbox != n or state_rows != n:
        raise RuntimeError(f"handled {len(store.commit_ns)} events / inbox {inbox} / state {state_rows}, expected {n}")
    lat = [store.commit_ns[k] - pub[k] for k in pub]
    first_pub = min(pub.values())
    last_commit = max(store.commit_ns.values())
    return {
        "n": n,
        "msgs_per_s": rate(n, last_commit - first_pub),
        "latency": {"what": "publish_async returned (publisher process) -> inbox commit", **lat_summary(lat)},
        "publisher_msgs_per_s": rate(n, max(report["pub_ns"]) - first_pub),
        "publisher_acked_msgs_per_s": rate(n, report["acked_ns"] - first_pub),
        "cpu": cpu,
        "bus_close_s": round(close_s, 2),
    }


def _recv_within(conn: Any, timeout_s: float) -> Any:
    if not conn.poll(timeout_s):
        return None
    try:
        return conn.recv()
    except EOFError:
        return None


# ---------------------------------------------------------------- candidates (prototypes only)


class CandidatePipelinedRelay:
    """CANDIDATE runtime change, prototyped here only to measure it; NOT ibpool's relay.

    Same contract as OutboxRelay (rows leave in seq order of what is visible, at-least-once,
    delete after ack, one relay per schema), but pipelined: (1) the advisory lock is a session
    lock held on one connection for the relay's life instead of a transaction per batch,
    (2) the next batch is read and published while up to `depth` earlier batches still await
    their acks; rows in flight are excluded by seq (`NOT seq = ANY(inflight)`), never by a
    cursor `seq > last`, which would skip rows of transactions that commit out of seq order,
    (3) acked rows are deleted with one autocommit statement per batch.
    """

    def __init__(self, store: Store, bus: Bus, window: int, depth: int = 4, poll_s: float = 0.5) -> None:
        self.store = store
        self.bus = bus
        self.window = window
        self.depth = depth
        self.poll_s = poll_s
        self.published = 0

    async def run(self, stop: asyncio.Event) -> None:
        wake = self.store.outbox_committed()
        key = f"ibpool.outbox.{self.store.schema}"
        async with self.store.pool.acquire() as conn:
            if not await conn.fetchval("SELECT pg_try_advisory_lock(hashtext($1))", key):
                return
            try:
                await self._loop(conn, wake, stop)
            finally:
                await conn.execute("SELECT pg_advisory_unlock(hashtext($1))", key)

    async def _loop(self, conn: asyncpg.Connection, wake: asyncio.Event, stop: asyncio.Event) -> None:
        inflight: list[tuple[list[int], asyncio.Future[Any]]] = []
        while not stop.is_set() or inflight:
            wake.clear()
            rows: list[Any] = []
            if not stop.is_set() and len(inflight) < self.depth:
                busy = [s for seqs, _ in inflight for s in seqs]
                rows = await conn.fetch(
                    "SELECT seq, subject, headers, body FROM outbox WHERE NOT (seq = ANY($1::bigint[]))"
                    " ORDER BY seq LIMIT $2",
                    busy,
                    self.window,
                )
            if rows:
                futs = [
                    await self.bus.js.publish_async(
                        r["subject"], bytes(r["body"]), headers=msgspec.json.decode(r["headers"])
                    )
                    for r in rows
                ]
                inflight.append(([r["seq"] for r in rows], asyncio.gather(*futs)))
            # Retire finished batches in order; block on the oldest only when full or idle.
            while inflight and (inflight[0][1].done() or len(inflight) >= self.depth or not rows):
                seqs, acks = inflight.pop(0)
                await asyncio.wait_for(acks, 10)
                await conn.execute("DELETE FROM outbox WHERE seq = ANY($1::bigint[])", seqs)
                self.published += len(seqs)
            if not rows and not inflight:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=self.poll_s)
        # A real implementation must, on a failed batch, drop every later in-flight batch and
        # start again from the head of the outbox (JetStream dedups the copies by Nats-Msg-Id).


_CANDIDATE_TRACER: Any = None


def _otel_metrics() -> tuple[Any, Any]:
    """The consumer's OTel instruments, so candidates record what ibpool's consumer records."""
    return getattr(ibpool_consumer, "_handled", None), getattr(ibpool_consumer, "_handler_duration", None)


class CandidateBatchInboxConsumer(Consumer):
    """CANDIDATE runtime change, prototyped here only to measure it; NOT ibpool's consumer.

    Happy path of a batch: all inbox rows in one statement (INSERT ... SELECT unnest(...)
    ON CONFLICT DO NOTHING RETURNING) instead of SAVEPOINT + INSERT + RELEASE per message; handlers
    run in the batch transaction without a savepoint each; the span per message is kept, from a
    tracer fetched once (ibpool calls telemetry.tracer() per message). If any handler raises, the
    batch transaction rolls back and the batch is handled again by the current per-message path,
    so a failing handler still rolls back only its own work.
    """

    async def process(self, msgs: Sequence[Any]) -> None:
        global _CANDIDATE_TRACER
        if self.store is None or not self.sub.transactional:
            return await Consumer.process(self, msgs)
        if _CANDIDATE_TRACER is None:
            _CANDIDATE_TRACER = telemetry.tracer("ibpool.consumer")
        handled, duration = _otel_metrics()
        events: list[tuple[Any, Any]] = []
        for msg in msgs:
            try:
                events.append((msg, decode(msg.data)))
            except DecodeError:
                await Consumer.process(self, [msg])  # the DLQ path, unchanged
        if not events:
            return None
        try:
            async with self.store.transaction() as tx:
                fresh = set(
                    await tx.conn.fetchval(
                        "WITH ins AS (INSERT INTO inbox (consumer, event_id) SELECT $1, unnest($2::text[])"
                        " ON CONFLICT DO NOTHING RETURNING event_id)"
                        " SELECT coalesce(array_agg(event_id), '{}') FROM ins",
                        self.sub.durable,
                        [e.id for _, e in events],
                    )
                )
                for msg, e in events:
                    if e.id not in fresh:
                        continue
                    headers = dict(msg.headers or {})
                    token = otel_context.attach(telemetry.extract(headers))
                    started = time.perf_counter()
                    try:
                        with _CANDIDATE_TRACER.start_as_current_span(
                            f"handle {e.ce_type()}",
                            kind=trace.SpanKind.CONSUMER,
                            attributes={
                                "messaging.system": "nats",
                                "messaging.destination.name": msg.subject,
                                "messaging.message.id": e.id,
                                "messaging.consumer.group.name": self.sub.durable,
                            },
                        ):
                            ctx = HandlerContext(tx, msg.subject, 1, headers, self.source)
                            await self.sub.handler(e, ctx)
                    finally:
                        otel_context.detach(token)
                        elapsed = time.perf_counter() - started
                        self.metrics.handler_seconds.labels(self.sub.durable).observe(elapsed)
                        if duration is not None:
                            duration.record(elapsed, {"consumer": self.sub.durable})
        except Exception:
            return await Consumer.process(self, [m for m, _ in events])
        for msg, e in events:
            await msg.ack()
            if e.id in fresh:
                self.metrics.handled.labels(self.sub.durable, e.ce_type()).inc()
                if handled is not None:
                    handled.add(1, {"consumer": self.sub.durable, "type": e.ce_type()})
            else:
                self.metrics.duplicates.labels(self.sub.durable).inc()
        return None


class CandidateBatchHandlerConsumer(Consumer):
    """CANDIDATE API change (upper bound), prototyped here only to measure it; NOT ibpool's consumer.

    Like CandidateBatchInboxConsumer, but the handler gets the whole batch and writes its state
    rows with one executemany, and there is one span per batch instead of one per message.
    """

    async def process(self, msgs: Sequence[Any]) -> None:
        global _CANDIDATE_TRACER
        if self.store is None or not self.sub.transactional:
            return await Consumer.process(self, msgs)
        if _CANDIDATE_TRACER is None:
            _CANDIDATE_TRACER = telemetry.tracer("ibpool.consumer")
        handled, duration = _otel_metrics()
        events: list[tuple[Any, Any]] = []
        for msg in msgs:
            try:
                events.append((msg, decode(msg.data)))
            except DecodeError:
                await Consumer.process(self, [msg])
        if not events:
            return None
        try:
            async with self.store.transaction() as tx:
                fresh = set(
                    await tx.conn.fetchval(
                        "WITH ins AS (INSERT INTO inbox (consumer, event_id) SELECT $1, unnest($2::text[])"
                        " ON CONFLICT DO NOTHING RETURNING event_id)"
                        " SELECT coalesce(array_agg(event_id), '{}') FROM ins",
                        self.sub.durable,
                        [e.id for _, e in events],
                    )
                )
                todo = [e for _, e in events if e.id in fresh]
                started = time.perf_counter()
                with _CANDIDATE_TRACER.start_as_current_span(
                    "handle batch", kind=trace.SpanKind.CONSUMER, attributes={"ibpool.batch": len(todo)}
                ):
                    await tx.conn.executemany(
                        "INSERT INTO bench_state (event_id, node_id, seq) VALUES ($1, $2, $3)",
                        [(e.id, e.node_id, seq_of(e)) for e in todo],
                    )
                    tx.bench_ids.extend(e.id for e in todo)  # type: ignore[attr-defined]
                elapsed = time.perf_counter() - started
                self.metrics.handler_seconds.labels(self.sub.durable).observe(elapsed)
                if duration is not None:
                    duration.record(elapsed, {"consumer": self.sub.durable})
        except Exception:
            return await Consumer.process(self, [m for m, _ in events])
        for msg, e in events:
            await msg.ack()
            self.metrics.handled.labels(self.sub.durable, e.ce_type()).inc()
            if handled is not None:
                handled.add(1, {"consumer": self.sub.durable, "type": e.ce_type()})
        return None


class CandidateConsumerFactory(ConsumerFactory):
    def __init__(self, cls: type[Consumer]) -> None:
        self.cls = cls

    def __call__(self, bus: Bus, store: Store, sub: Subscription, settings: ConsumerSettings) -> Consumer:
        return self.cls(bus, store, sub, settings, ServiceMetrics("bench"), source=SOURCE)


async def _no_reset(_conn: asyncpg.Connection) -> None:
    return None


async def candidate_no_reset_pool(store: Store, dsn: str) -> None:
    """CANDIDATE: the store's pool without asyncpg's reset query on every release.

    asyncpg runs `SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL` each time a
    connection goes back to the pool: one more round trip per transaction. ibpool takes no
    session state on pooled connections except the migration lock, which it releases itself.
    """
    old = store.pool
    store.pool = await asyncpg.create_pool(
        dsn,
        min_size=1,
        max_size=old.get_max_size(),
        server_settings={"search_path": store.schema},
        timeout=5,
        reset=_no_reset,
    )
    await old.close()
    await asyncio.gather(*(store.pool.fetchval("SELECT pg_sleep(0.01)") for _ in range(store.pool.get_max_size())))


def candidate_relay(store: Store, bus: Bus, window: int) -> Any:
    return CandidatePipelinedRelay(store, bus, window)


# ---------------------------------------------------------------- one run


Phase = tuple[str, Callable[[], Awaitable[dict[str, Any]]]]


def phases(args: argparse.Namespace, url: str, dsn: str) -> list[Phase]:
    n, w, p = args.n, args.window, args.producers
    out: list[Phase] = [
        ("core", lambda: bench_core(url, n)),
        ("raw", lambda: bench_raw(url, n, w)),
        ("outbox_1", lambda: bench_outbox(url, dsn, n, w, per_tx=1, producers=p)),
        ("outbox_100", lambda: bench_outbox(url, dsn, n, w, per_tx=args.batch, producers=p)),
        ("e2e", lambda: bench_e2e(url, dsn, n, w)),
        ("e2e_paced", lambda: bench_e2e(url, dsn, args.paced_n, w, pace=args.paced_rate, label="paced")),
    ]
    if args.candidates:
        out = [
            *out,
            ("raw_ibpool_headers", lambda: bench_raw(url, n, w, with_headers=True)),
            (
                "candidate_outbox_1",
                lambda: bench_outbox(
                    url, dsn, n, w, per_tx=1, producers=p, relay_factory=candidate_relay, label="cand"
                ),
            ),
            (
                "candidate_outbox_100",
                lambda: bench_outbox(
                    url,
                    dsn,
                    n,
                    w,
                    per_tx=args.batch,
                    producers=p,
                    relay_factory=candidate_relay,
                    label="cand",
                ),
            ),
            (
                "candidate_outbox_1_noreset",
                lambda: bench_outbox(url, dsn, n, w, per_tx=1, producers=p, label="cand_nr", pool_reset=False),
            ),
            (
                "candidate_e2e",
                lambda: bench_e2e(
                    url,
                    dsn,
                    n,
                    w,
                    consumer_factory=CandidateConsumerFactory(CandidateBatchInboxConsumer),
                    label="cand_e2e",
                ),
            ),
            (
                "candidate_e2e_batch_handler",
                lambda: bench_e2e(
                    url,
                    dsn,
                    n,
                    w,
                    consumer_factory=CandidateConsumerFactory(CandidateBatchHandlerConsumer),
                    label="cand_e2e_bh",
                ),
            ),
        ]
    if args.phases:
        out = [p for p in out if p[0] in args.phases or p[0] == "raw"]
    return out


async def run_all(args: argparse.Namespace, stack: Stack) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in stack.settings}
    # Streams exist once per server; ibpool's own declaration.
    for name in stack.settings:
        bus = await Bus.connect(stack.nats[name][1], name="bench-setup", attempts=3)
        try:
            await bus.ensure_streams()
        finally:
            await bus.close()
    started = time.monotonic()
    for r in range(args.runs):
        order = stack.settings if r % 2 == 0 else list(reversed(stack.settings))
        for name in order:
            CPU.nats_pid, CPU.pg_pid = stack.nats[name][0].pid, stack.pg_pid
            result: dict[str, Any] = {}
            for phase, fn in phases(args, stack.nats[name][1], stack.dsn):
                if time.monotonic() - started > args.max_seconds:
                    raise RuntimeError(f"benchmark exceeded --max-seconds {args.max_seconds}")
                t = time.monotonic()
                result[phase] = await asyncio.wait_for(fn(), PHASE_TIMEOUT_S + 60)
                result[phase]["wall_s"] = round(time.monotonic() - t, 2)
                print(
                    f"  run {r + 1} {name:12s} {phase:22s} {result[phase]['msgs_per_s']:>10.0f} msg/s"
                    + _lat_text(result[phase]),
                    flush=True,
                )
            runs[name].append(result)
    return runs


def _lat_text(r: dict[str, Any]) -> str:
    lat = r.get("latency")
    return f"   p50 {lat['p50_ms']:8.2f} ms  p99 {lat['p99_ms']:8.2f} ms" if lat else ""


# ---------------------------------------------------------------- summary


FLOORS = {"outbox_1": 0.5, "outbox_100": 0.5, "e2e": 0.4}
NO_RATIO = {"core", "raw", "e2e_paced"}  # e2e_paced runs at a fixed offered rate: latency only


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for setting, rs in runs.items():
        s: dict[str, Any] = {}
        for phase in rs[0]:
            vals = [r[phase]["msgs_per_s"] for r in rs]
            entry: dict[str, Any] = {
                "msgs_per_s": round(statistics.median(vals), 1),
                "msgs_per_s_min": min(vals),
                "msgs_per_s_max": max(vals),
            }
            for key in ("latency", "latency_to_stored"):
                if key in rs[0][phase]:
                    entry[key] = {
                        "what": rs[0][phase][key]["what"],
                        "p50_ms": round(statistics.median(r[phase][key]["p50_ms"] for r in rs), 3),
                        "p99_ms": round(statistics.median(r[phase][key]["p99_ms"] for r in rs), 3),
                    }
            if phase not in NO_RATIO:
                ratios = [r[phase]["msgs_per_s"] / r["raw"]["msgs_per_s"] for r in rs]
                entry["ratio_vs_raw"] = round(statistics.median(ratios), 3)
                entry["ratio_vs_raw_per_run"] = [round(x, 3) for x in ratios]
                base = phase.removeprefix("candidate_").removesuffix("_noreset").removesuffix("_batch_handler")
                if base in FLOORS:
                    entry["floor"] = FLOORS[base]
                    entry["floor_holds"] = entry["ratio_vs_raw"] >= FLOORS[base]
                    entry["floor_holds_runs"] = f"{sum(x >= FLOORS[base] for x in ratios)}/{len(ratios)}"
            s[phase] = entry
        summary[setting] = s
    return summary


PACED_LABEL = "400"


def table(summary: dict[str, Any]) -> str:
    head = (
        "| nats fsync | path | msgs/s (median) | p50 ms | p99 ms | latency measured | vs raw | floor |\n"
        "|---|---|---:|---:|---:|---|---:|---|"
    )
    lines = [head]
    for setting, s in summary.items():
        label = "always" if setting == "sync_always" else "default"
        for phase, e in s.items():
            lat = e.get("latency")
            p50 = f"{lat['p50_ms']:.1f}" if lat else "-"
            p99 = f"{lat['p99_ms']:.1f}" if lat else "-"
            what = lat["what"] if lat else "-"
            ratio = f"{e['ratio_vs_raw']:.2f}x" if "ratio_vs_raw" in e else ("1.00x" if phase == "raw" else "-")
            floor = (
                f">= {e['floor']}x: {'PASS' if e['floor_holds'] else 'FAIL'} ({e['floor_holds_runs']} runs)"
                if "floor" in e
                else "-"
            )
            name = f"{phase} (offered {PACED_LABEL}/s)" if phase == "e2e_paced" else phase
            lines.append(f"| {label} | {name} | {e['msgs_per_s']:,.0f} | {p50} | {p99} | {what} | {ratio} | {floor} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- machine info


def machine_info(dsn_settings: dict[str, str]) -> dict[str, Any]:
    def ver(pkg: str) -> str:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    nats_version = subprocess.run(
        [str(devstack.nats_server_binary()), "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    runtime_dir = Path(devstack.__file__).parent
    digest = hashlib.sha256()
    for f in RUNTIME_FILES:
        digest.update((runtime_dir / f).read_bytes())
    return {
        "nproc": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": cpu,
        "loadavg_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "nats_server": nats_version,
        "nats_py": ver("nats-py"),
        "asyncpg": ver("asyncpg"),
        "msgspec": ver("msgspec"),
        "opentelemetry_sdk": ver("opentelemetry-sdk"),
        "postgres": dsn_settings,
        "runtime_sources_sha256": digest.hexdigest()[:16],
    }


async def pg_settings(dsn: str) -> dict[str, str]:
    conn = await asyncpg.connect(dsn)
    try:
        return {
            k: await conn.fetchval(f"SHOW {k}")
            for k in ("server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method")
        }
    finally:
        await conn.close()


# ---------------------------------------------------------------- profiling


async def micro_commit(args: argparse.Namespace, stack: Stack) -> None:
    """Commit path only (no relay): N one-event outbox transactions from `producers` tasks,
    ibpool's Store pool vs the CANDIDATE pool without asyncpg's reset query, interleaved."""
    name = stack.settings[0]
    CPU.nats_pid, CPU.pg_pid = stack.nats[name][0].pid, stack.pg_pid
    msgs = make_messages(args.n)
    rows: dict[str, list[dict[str, float]]] = {"ibpool_pool": [], "candidate_no_reset_pool": []}
    for r in range(args.runs):
        for variant in rows if r % 2 == 0 else reversed(list(rows)):
            store = await fresh_store(stack.dsn, "bench_micro")
            if variant != "ibpool_pool":
                await candidate_no_reset_pool(store, stack.dsn)
            queue = list(reversed(msgs))

            async def producer(store: Store = store, queue: list[NodeRegistered] = queue) -> None:
                while queue:
                    m = queue.pop()
                    async with store.transaction() as tx:
                        await tx.outbox(m)

            c0 = CPU.snap()
            t0 = time.perf_counter_ns()
            await asyncio.wait_for(asyncio.gather(*(producer() for _ in range(args.producers))), PHASE_TIMEOUT_S)
            t1 = time.perf_counter_ns()
            cpu = CpuMeter.diff(c0, CPU.snap())
            await drop_store(store, stack.dsn)
            row = {
                "tx_per_s": rate(args.n, t1 - t0),
                "bench_cpu_us_per_tx": round(1e6 * cpu.get("bench_s", 0) / args.n, 1),
                "postgres_cpu_us_per_tx": round(1e6 * cpu.get("postgres_s", 0) / args.n, 1),
                "others_s": cpu.get("others_s", 0.0),
            }
            rows[variant].append(row)
            print(f"  run {r + 1} {variant:24s} {row}", flush=True)
    summary = {}
    for variant, rs in rows.items():
        summary[variant] = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        print(variant, summary[variant])
    if not args.no_write:
        out_dir = Path(args.out_dir) if args.out_dir else RESULTS
        out_dir.mkdir(parents=True, exist_ok=True)
        doc = {
            "benchmark": "bench_bus --micro-commit",
            "utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": machine_info(await pg_settings(stack.dsn)),
            "config": {"n_transactions": args.n, "events_per_tx": 1, "producers": args.producers},
            "summary_median": summary,
            "runs": rows,
        }
        path = out_dir / f"{args.out or 'micro_commit-' + dt.datetime.now(dt.UTC).date().isoformat()}.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {path}")


async def profile_path(args: argparse.Namespace, stack: Stack) -> None:
    name = stack.settings[0]
    url = stack.nats[name][1]
    CPU.nats_pid, CPU.pg_pid = stack.nats[name][0].pid, stack.pg_pid
    bus = await Bus.connect(url, name="bench-setup", attempts=3)
    await bus.ensure_streams()
    await bus.close()
    if args.profile == "relay":

        async def fn() -> dict[str, Any]:
            return await bench_outbox(url, stack.dsn, args.n, args.window, per_tx=args.batch, producers=args.producers)
    elif args.profile == "relay1":

        async def fn() -> dict[str, Any]:
            return await bench_outbox(url, stack.dsn, args.n, args.window, per_tx=1, producers=args.producers)
    else:

        async def fn() -> dict[str, Any]:
            return await bench_e2e(url, stack.dsn, args.n, args.window)

    if args.profiler == "pyinstrument":
        from pyinstrument import Profiler  # only installed for profiling, never a dependency
    await fn()  # warm-up, unprofiled
    if args.profiler == "pyinstrument":
        prof = Profiler(async_mode="enabled", interval=0.0005)
        prof.start()
        res = await fn()
        prof.stop()
        print(prof.output_text(unicode=False, color=False, show_all=False))
    else:
        import cProfile
        import pstats

        cp = cProfile.Profile()
        cp.enable()
        res = await fn()
        cp.disable()
        if args.profile_dump:
            cp.dump_stats(args.profile_dump)
        st = pstats.Stats(cp)
        st.sort_stats("tottime").print_stats(35)
        st.sort_stats("cumulative").print_stats(45)
    print(json.dumps(res, indent=1))


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n", type=int, default=5000, help="messages per measurement (default 5000)")
    ap.add_argument("--paced-n", type=int, default=1000, help="messages of the e2e_paced measurement")
    ap.add_argument("--paced-rate", type=float, default=400.0, help="offered msgs/s of e2e_paced")
    ap.add_argument("--window", type=int, default=256, help="in-flight publish window (ibpool's outbox_window)")
    ap.add_argument("--producers", type=int, default=8, help="concurrent committing producers for outbox_*")
    ap.add_argument("--batch", type=int, default=100, help="events per transaction for outbox_100")
    ap.add_argument("--settings", default="sync_always,sync_default")
    ap.add_argument("--max-seconds", type=float, default=900.0, help="abort if the runs take longer")
    ap.add_argument("--candidates", action="store_true", help="also measure candidate runtime changes")
    ap.add_argument("--phases", default="", help="comma list: measure only these phases (and raw)")
    ap.add_argument("--profile", choices=["relay", "relay1", "consumer"], help="profile one path instead")
    ap.add_argument("--micro-commit", action="store_true", help="commit path only, pool reset vs not")
    ap.add_argument("--profiler", choices=["cprofile", "pyinstrument"], default="cprofile")
    ap.add_argument("--profile-dump", default=None, help="also save the cProfile stats to this file")
    ap.add_argument("--out", default=None, help="result file stem (default bench_bus-<UTC date>)")
    ap.add_argument("--out-dir", default=None, help="where result files go (default tests/bench/results)")
    ap.add_argument("--no-write", action="store_true", help="print only, write no result files")
    args = ap.parse_args(argv)
    global PACED_LABEL
    PACED_LABEL = f"{args.paced_rate:g}"
    args.settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    args.phases = [s.strip() for s in args.phases.split(",") if s.strip()]
    for s in args.settings:
        if s not in SETTINGS:
            ap.error(f"unknown setting {s!r}; known: {', '.join(SETTINGS)}")
    if args.runs < 1 or args.n < args.batch:
        ap.error("--runs must be >= 1 and --n >= --batch")
    return args


def _on_sigterm(_signum: int, _frame: Any) -> None:
    raise SystemExit(143)


def run_async(coro: Awaitable[Any]) -> Any:
    """asyncio.run with SIGTERM cancelling the main task (so every `finally` runs), then exit 143."""
    terminated = False

    async def main() -> Any:
        nonlocal terminated
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_term() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()
            loop.remove_signal_handler(signal.SIGTERM)  # a second SIGTERM exits at once
            signal.signal(signal.SIGTERM, _on_sigterm)

        loop.add_signal_handler(signal.SIGTERM, on_term)
        return await coro

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if terminated:
            raise SystemExit(143) from None
        raise


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging("bench", "warning")
    telemetry.setup_tracing("bench")  # what every service does at start (spans not kept without OTLP)
    signal.signal(signal.SIGTERM, _on_sigterm)
    started = dt.datetime.now(dt.UTC)
    with tempfile.TemporaryDirectory(prefix="ibpool-bench-") as tmp:
        stack = Stack(Path(tmp), args.settings)
        try:
            stack.start()
            if args.profile:
                run_async(profile_path(args, stack))
                return 0
            if args.micro_commit:
                run_async(micro_commit(args, stack))
                return 0
            pg = run_async(pg_settings(stack.dsn))
            info = machine_info(pg)
            print(
                f"bench_bus: N={args.n} body={PAYLOAD_BYTES}B window={args.window} runs={args.runs} "
                f"settings={','.join(args.settings)} postgres fsync={pg['fsync']} "
                f"synchronous_commit={pg['synchronous_commit']}",
                flush=True,
            )
            runs = run_async(run_all(args, stack))
        finally:
            stack.stop()
    summary = summarise(runs)
    doc = {
        "benchmark": "bench_bus",
        "started_utc": started.isoformat(timespec="seconds"),
        "finished_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "tests/bench/bench_bus.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": info,
        "config": {
            "n": args.n,
            "payload_bytes": len(encode(make_messages(1)[0])),
            "window": args.window,
            "producers": args.producers,
            "batch_per_tx": args.batch,
            "e2e_paced": {"n": args.paced_n, "offered_msgs_per_s": args.paced_rate},
            "runs": args.runs,
            "settings": {s: {"nats_sync_interval": "always" if SETTINGS[s] else "default"} for s in args.settings},
            "stream": STREAM,
            "consumer": vars(ConsumerSettings()),
            "postgres": "devstack.start_postgres(fsync=True): fsync on, synchronous_commit on",
            "tracing": "telemetry.setup_tracing: SDK tracer, spans not kept, OTel metrics no-op (without OTLP)",
        },
        "floors": FLOORS,
        "summary": summary,
        "runs": runs,
    }
    print()
    print(table(summary))
    if not args.no_write:
        out_dir = Path(args.out_dir) if args.out_dir else RESULTS
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = args.out or f"bench_bus-{started.date().isoformat()}"
        text = json.dumps(doc, indent=1) + "\n"
        (out_dir / f"{stem}.json").write_text(text)
        if not args.out:
            (out_dir / "latest.json").write_text(text)
        written = (out_dir / f"{stem}.json").resolve()
        print(f"\nwrote {written.relative_to(REPO) if written.is_relative_to(REPO) else written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
