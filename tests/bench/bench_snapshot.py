"""Ledger snapshots at 1,000 to 12,500 nodes: their size, the allocator's store and the replicas' start.

What: for each size (nodes of 8 GPUs), a busy ledger (`libs/core/tests/busy_ledger.py`: built
through `allocate.decide` and `ledger.apply` as the allocator builds it; most GPUs held by gangs,
whole-GPU jobs, fractions and MIG instances; the past an allocator keeps, `PAST_KEPT` answers and end
events of allocations no longer held, half-way through its sawtooth), then, with the real functions:

  size         the stored snapshot (`encode_ledger(ledger)`, what `snapshot_once` keeps in Postgres)
               and the replicas' (`encode_snapshot` of a `LedgerSnapshot` of
               `encode_ledger(without_past(ledger))`, what it puts in the object store), in bytes,
               per node and per GPU
  encode       `encode_ledger` of each (the replicas' with its `without_past`), in memory: the part
               of `snapshot_once` done under the ledger lock
  decode       `decode_ledger` of each (the replicas' with `past_kept=0`)
  postgres     `state.save_snapshot` in a transaction of its own, as `snapshot_once` writes it;
               `state.latest_snapshot` + `check_format` + `decode_ledger`, as `catch_up` loads it
               when an allocator starts (nothing of the log after it to apply here)
  object store `publish_snapshot` (replaces the object) and `read_snapshot` + `decode_ledger(past_kept=0)`,
               as `LedgerReplica.start_point` reads it, against nats-server
  replica      a `LedgerReplica` from `run()` until `caught_up`: from the snapshot (published at
               the ledger `--tail` events before its end, so the replica also replays those events
               from the stream) and, with no snapshot in the bucket, from the stream's first event
               (every event that built the ledger, published on IBPOOL_POOL in batches of 1,000 with
               `Bus.publish_batch`, as the outbox relay publishes them); each run checks the
               replica's ledger against the allocator's (nodes, allocations, version)

The stack is the embedded one (`devstack.up`: nats-server with `sync_interval: always`, Postgres
with fsync), started here in a temp dir and always stopped; the pool stream and the snapshot bucket
are made anew for each size. Every timing is the median of --runs runs (each run's figures are
in the results file too); the ledger is built once per size (its build time is reported, not a
median).

Results: tests/bench/results/bench_snapshot-latest.json
Usage: .venv/bin/python tests/bench/bench_snapshot.py --sizes 1000,5000,12500 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import nats.js.errors

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO)]

from bench_report import machine  # noqa: E402

from ibpool_core.pool.ledger import (  # noqa: E402
    Ledger,
    LedgerSnapshot,
    check_format,
    decode_ledger,
    encode_ledger,
    encode_snapshot,
    rebuild,
    without_past,
)
from ibpool_core.pool.messages import LedgerEvent  # noqa: E402
from ibpool_pool_allocator import state  # noqa: E402
from ibpool_proto.pool import AllocationGranted  # noqa: E402
from ibpool_runtime import devstack  # noqa: E402
from ibpool_runtime.bus import Bus, outgoing  # noqa: E402
from ibpool_runtime.ledger_replica import LEDGER_BUCKET, LedgerReplica, publish_snapshot, read_snapshot  # noqa: E402
from ibpool_runtime.logs import configure_logging  # noqa: E402
from ibpool_runtime.store import Store  # noqa: E402
from ibpool_runtime.streams import STREAMS, stream_for_subject  # noqa: E402
from libs.core.tests.busy_ledger import GPUS_PER_NODE, busy_ledger  # noqa: E402

RESULTS = HERE / "results"
POOL_STREAM = stream_for_subject(AllocationGranted.subject_pattern())
PUBLISH_BATCH = 1_000
CATCH_UP_TIMEOUT_S = 600.0


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


async def atimed(call: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await call()
    return time.perf_counter() - started


def cut_before(events: list[LedgerEvent], tail: int) -> int:
    """The index of the first of (about) the last `tail` events that begins a version: a snapshot
    stands between two decisions, never inside one."""
    cut = max(1, len(events) - tail)
    while cut > 1 and events[cut].ledger_version == events[cut - 1].ledger_version:
        cut -= 1
    return cut


def same_ledger(replica: Ledger, allocator: Ledger) -> bool:
    """What a replica keeps equal to the allocator's ledger (it keeps no past)."""
    return (replica.version, replica.nodes, replica.allocations, replica.usage, replica.quotas) == (
        allocator.version,
        allocator.nodes,
        allocator.allocations,
        allocator.usage,
        allocator.quotas,
    )


async def fresh_pool_stream(bus: Bus) -> None:
    """IBPOOL_POOL made anew (empty, its duplicate window forgotten) and no snapshot bucket."""
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await bus.js.delete_stream(POOL_STREAM)
    with contextlib.suppress(nats.js.errors.NotFoundError, nats.js.errors.BucketNotFoundError):
        await bus.js.delete_object_store(LEDGER_BUCKET)
    await bus.ensure_streams(specs=[s for s in STREAMS if s.name == POOL_STREAM])


async def replica_start(bus: Bus, expected: Ledger) -> tuple[float, bool]:
    """Seconds from a new LedgerReplica's `run()` to `caught_up`, and whether it began at a snapshot."""
    replica = LedgerReplica(bus)
    stop = asyncio.Event()
    started = time.perf_counter()
    task = asyncio.create_task(replica.run(stop))
    try:
        deadline = started + CATCH_UP_TIMEOUT_S
        while not replica.caught_up:
            if task.done():
                task.result()
                raise RuntimeError("the replica stopped before it caught up")
            if time.perf_counter() > deadline:
                raise TimeoutError(f"the replica did not catch up within {CATCH_UP_TIMEOUT_S} s")
            await asyncio.sleep(0.002)
        took = time.perf_counter() - started
    finally:
        stop.set()
        await task
    if not same_ledger(replica.ledger, expected):
        raise AssertionError(f"the replica's ledger (version {replica.ledger.version}) is not the allocator's")
    return took, replica.from_snapshot


async def one_size(nodes: int, runs: int, tail: int, replay: bool, info: devstack.StackInfo) -> dict[str, Any]:
    print(f"--- {nodes:,} nodes: building the ledger", flush=True)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    busy = busy_ledger(nodes)
    build_s = time.perf_counter() - started
    ledger, events = busy.ledger, busy.events
    cut = cut_before(events, tail)
    at_cut = rebuild(events[:cut])
    gc.collect()
    gc.freeze()  # the built ledger and its events stay all along: keep the collector's full passes off them

    stored = encode_ledger(ledger)
    published_ledger = encode_ledger(without_past(ledger))
    published = encode_snapshot(LedgerSnapshot(version=ledger.version, stream_seq=1, ledger=published_ledger))
    figures: dict[str, Any] = {
        "nodes": nodes,
        "gpus": nodes * GPUS_PER_NODE,
        "gpus_held": busy.gpus_held,
        "allocations": len(ledger.allocations),
        "allocations_by_kind": busy.kinds,
        "gang_nodes_max": max((len(a.nodes) for a in ledger.allocations.values() if a.kind == "gang"), default=0),
        "ledger_version": ledger.version,
        "events": len(events),
        "answers_kept": len(ledger.answers),
        "ends_kept": len(ledger.ended),
        "build_s": round(build_s, 1),
        "stored_bytes": len(stored),
        "stored_bytes_per_node": round(len(stored) / nodes),
        "published_bytes": len(published),
        "published_bytes_per_node": round(len(published) / nodes),
        "published_bytes_per_gpu": round(len(published) / nodes / GPUS_PER_NODE),
        "tail_events": len(events) - cut,
    }
    runs_out: list[dict[str, float]] = [{} for _ in range(runs)]

    # In memory: the encodings under the allocator's lock, and the decodings at start.
    for r in range(runs):
        run = runs_out[r]
        run["encode_stored_ms"] = ms(timed(lambda: encode_ledger(ledger)))
        run["encode_published_ms"] = ms(timed(lambda: encode_ledger(without_past(ledger))))
        run["decode_stored_ms"] = ms(timed(lambda: decode_ledger(stored)))
        run["decode_published_ms"] = ms(timed(lambda: decode_ledger(published_ledger, past_kept=0)))

    # Postgres: the allocator's snapshot written as snapshot_once writes it, and read back as an allocator starts.
    store = await Store.connect(info.postgres_dsn, f"bench_snapshot_{nodes}")
    try:
        await store.migrate(state.MIGRATIONS)
        for r in range(runs):
            snapshot = state.Snapshot((ledger.version + r, 0), events[-1].id, stored)

            async def save(snapshot: state.Snapshot = snapshot) -> None:
                async with store.transaction() as tx:
                    await state.save_snapshot(tx.conn, snapshot)

            runs_out[r]["pg_save_ms"] = ms(await atimed(save))
            fetched: list[state.Snapshot] = []

            async def fetch(into: list[state.Snapshot] = fetched) -> None:
                got = await state.latest_snapshot(store.pool)
                assert got is not None
                check_format(got.format, "the stored snapshot")
                into.append(got)

            runs_out[r]["pg_fetch_ms"] = ms(await atimed(fetch))
            runs_out[r]["pg_decode_ms"] = ms(timed(partial(decode_ledger, fetched[0].ledger)))
            runs_out[r]["pg_load_ms"] = round(runs_out[r]["pg_fetch_ms"] + runs_out[r]["pg_decode_ms"], 1)
            assert fetched[0].at == snapshot.at and len(fetched[0].ledger) == len(stored)
        figures["pg_snapshot_rows"] = int(await store.pool.fetchval("SELECT count(*) FROM ledger_snapshots"))
    finally:
        await store.close()

    bus = await Bus.connect(info.nats_url, name="bench-snapshot")
    try:
        await fresh_pool_stream(bus)
        print(f"    publishing {len(events):,} events on {POOL_STREAM}", flush=True)
        started = time.perf_counter()
        for i in range(0, len(events), PUBLISH_BATCH):
            await bus.publish_batch([outgoing(e) for e in events[i : i + PUBLISH_BATCH]], timeout_s=60.0)
        figures["publish_events_s"] = round(time.perf_counter() - started, 1)
        stream = (await bus.js.stream_info(POOL_STREAM)).state
        assert (stream.first_seq, stream.last_seq) == (1, len(events)), (stream.first_seq, stream.last_seq)
        figures["pool_stream_bytes"] = stream.bytes

        # No snapshot yet: a replica replays the stream from its first event.
        for r in range(runs if replay else 0):
            took, from_snapshot = await replica_start(bus, ledger)
            assert not from_snapshot
            runs_out[r]["replica_replay_ms"] = ms(took)
            print(f"    replay from the first event: {took:.2f} s", flush=True)

        # The object store: the replicas' snapshot of the ledger as it stood before the tail.
        for_replicas = LedgerSnapshot(
            version=at_cut.version, stream_seq=cut + 1, ledger=encode_ledger(without_past(at_cut))
        )
        figures["replica_snapshot_bytes"] = len(encode_snapshot(for_replicas))
        for r in range(runs):
            runs_out[r]["os_publish_ms"] = ms(await atimed(lambda: publish_snapshot(bus, for_replicas)))
            read: list[LedgerSnapshot] = []

            async def fetch_snapshot(into: list[LedgerSnapshot] = read) -> None:
                got = await read_snapshot(bus)
                assert got is not None
                into.append(got)

            runs_out[r]["os_read_ms"] = ms(await atimed(fetch_snapshot))
            runs_out[r]["os_decode_ms"] = ms(timed(partial(decode_ledger, read[0].ledger, past_kept=0)))
            runs_out[r]["os_load_ms"] = round(runs_out[r]["os_read_ms"] + runs_out[r]["os_decode_ms"], 1)
            assert read[0] == for_replicas

        # A replica from the snapshot: read, decode, then replay the tail from the stream.
        for r in range(runs):
            took, from_snapshot = await replica_start(bus, ledger)
            assert from_snapshot
            runs_out[r]["replica_from_snapshot_ms"] = ms(took)
            print(f"    start from the snapshot (+{len(events) - cut:,} events): {took:.2f} s", flush=True)
    finally:
        await bus.close()
        gc.unfreeze()

    keys = sorted({k for run in runs_out for k in run})
    # The machine's load around the runs: other work on it makes every timing slower.
    figures["load_1m"] = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}
    figures["median"] = {k: round(statistics.median(run[k] for run in runs_out), 1) for k in keys}
    figures["runs"] = runs_out
    return figures


def table(sizes: list[dict[str, Any]]) -> str:
    """The results as markdown, one column per size."""
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("nodes / GPUs", lambda f: f"{f['nodes']:,} / {f['gpus']:,}"),
        ("load average (1 min) before / after", lambda f: f"{f['load_1m']['before']} / {f['load_1m']['after']}"),
        ("GPUs held", lambda f: f"{f['gpus_held']:,} ({100 * f['gpus_held'] / f['gpus']:.0f} %)"),
        (
            "allocations held",
            lambda f: (
                f"{f['allocations']:,} (" + ", ".join(f"{k} {v:,}" for k, v in f["allocations_by_kind"].items()) + ")"
            ),
        ),
        ("ledger version / events", lambda f: f"{f['ledger_version']:,} / {f['events']:,}"),
        ("answers / end events kept", lambda f: f"{f['answers_kept']:,} / {f['ends_kept']:,}"),
        ("stored snapshot (Postgres)", lambda f: f"{f['stored_bytes'] / 1e6:.1f} MB"),
        ("published snapshot (object store)", lambda f: f"{f['published_bytes'] / 1e6:.1f} MB"),
        (
            "  bytes per node: stored / published",
            lambda f: f"{f['stored_bytes_per_node']:,} / {f['published_bytes_per_node']:,}",
        ),
        (
            "encode ms: stored / published",
            lambda f: f"{f['median']['encode_stored_ms']} / {f['median']['encode_published_ms']}",
        ),
        (
            "decode ms: stored / published",
            lambda f: f"{f['median']['decode_stored_ms']} / {f['median']['decode_published_ms']}",
        ),
        ("Postgres save_snapshot ms", lambda f: f"{f['median']['pg_save_ms']}"),
        (
            "Postgres latest_snapshot + decode ms",
            lambda f: f"{f['median']['pg_load_ms']} ({f['median']['pg_fetch_ms']} + {f['median']['pg_decode_ms']})",
        ),
        ("object store publish_snapshot ms", lambda f: f"{f['median']['os_publish_ms']}"),
        (
            "object store read_snapshot + decode ms",
            lambda f: f"{f['median']['os_load_ms']} ({f['median']['os_read_ms']} + {f['median']['os_decode_ms']})",
        ),
        (
            "replica caught up from the snapshot ms",
            lambda f: f"{f['median']['replica_from_snapshot_ms']} (+{f['tail_events']:,} events)",
        ),
        (
            "replica caught up replaying every event ms",
            lambda f: (
                f"{f['median']['replica_replay_ms']} ({f['events']:,} events)"
                if "replica_replay_ms" in f["median"]
                else "not run"
            ),
        ),
    ]
    out = ["| | " + " | ".join(f"{f['nodes']:,} nodes" for f in sizes) + " |", "|---" * (len(sizes) + 1) + "|"]
    out += [f"| {label} | " + " | ".join(cell(f) for f in sizes) + " |" for label, cell in rows]
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--sizes", default="1000,5000,12500", help="comma-separated node counts (8 GPUs each)")
    p.add_argument("--runs", type=int, default=3, help="runs per measure; the median is reported")
    p.add_argument(
        "--tail", type=int, default=5_000, help="events after the replicas' snapshot, replayed from the stream"
    )
    p.add_argument(
        "--replay-max-nodes",
        type=int,
        default=1 << 30,
        help="replay the stream from its first event only at sizes up to this many nodes",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "bench_snapshot-latest.json")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    configure_logging("bench", "warning")
    about = machine()
    state_dir = Path(tempfile.mkdtemp(prefix="ibpool-bench-snapshot-"))
    info = devstack.up(state_dir, sync_always=True)
    results: list[dict[str, Any]] = []
    try:
        for n in sizes:
            results.append(asyncio.run(one_size(n, args.runs, args.tail, n <= args.replay_max_nodes, info)))
            print(table(results[-1:]), flush=True)
    finally:
        devstack.down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
    out = {
        "sizes": results,
        "runs": args.runs,
        "tail": args.tail,
        "stack": {"nats_sync_interval": "always", "postgres_fsync": True},
        "machine": about,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(table(results))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
