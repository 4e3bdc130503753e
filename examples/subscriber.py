#!/usr/bin/env python3
"""A billing-style subscriber to ibpool allocation events: nats-py, jsonschema and the standard
library only, against the published schemas in docs/events/schemas. No ibpool code is imported.

    python examples/subscriber.py --nats nats://127.0.0.1:4222 --durable billing --state billing.json

It binds (creating it on first run) a durable pull consumer on stream IBPOOL_POOL, filtered to the
allocation events granted / released / revoked / expired, and for each message:

1. skips it if its ce-id is already in the state file (a redelivery: the effect happened already);
2. validates the payload against its published JSON Schema (an invalid one is terminated);
3. applies the effect to the state (allocation -> per-node state, GPU-milli granted per tenant),
   records the ce-id, and writes the state file atomically. Records are per node, so a gang that
   replaced a failed member (revoked on the failed node, granted later on a new node under the same
   allocation id, `replaces` naming the failed node) just gains a node record;
4. only then acks. A crash between 3 and 4 makes JetStream redeliver the message after `ack_wait`,
   and step 1 turns it into a no-op: no gap, no double effect.

It exits after --max messages, or after --idle-exit seconds with nothing new, or on SIGINT/SIGTERM.
Set SUBSCRIBER_CRASH_AFTER_APPLY=N to exit hard (code 3) after the N-th applied event, state
written and not acked: a crash drill.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import signal
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
from jsonschema import Draft202012Validator
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

STREAM = "IBPOOL_POOL"
SUBJECT_ROOT = "ibpool.pool.allocation"
VERBS = ("granted", "released", "revoked", "expired")
ENDED = frozenset({"released", "revoked", "expired"})
DEFAULT_SCHEMAS = Path(__file__).resolve().parent.parent / "docs" / "events" / "schemas"
CRASH_ENV = "SUBSCRIBER_CRASH_AFTER_APPLY"
CRASH_EXIT = 3
HOLD_UNKNOWN_S = 60.0

State = dict[str, Any]
Payload = dict[str, Any]


# -- effects: pure functions of (state, payload), written for the v1 payloads --------------------


def node_record(state: State, payload: Payload) -> dict[str, Any]:
    """The record of one allocation on one node (a gang allocation has one per node)."""
    allocation = state["allocations"].setdefault(
        payload["allocation_id"], {"job_id": payload["job_id"], "tenant": None, "nodes": {}}
    )
    node: dict[str, Any] = allocation["nodes"].setdefault(payload["node_id"], {"state": None})
    return node


def apply_granted(state: State, payload: Payload) -> str:
    node = node_record(state, payload)
    allocation = state["allocations"][payload["allocation_id"]]
    allocation["tenant"] = payload.get("tenant", "")
    if "granted_at" in node:
        return str(node["state"])
    milli = sum(int(a.get("milli", 1000)) for a in payload["assignments"])
    node.update(granted_at=payload.get("occurred_at"), gpu_milli=milli, kind=payload["kind"])
    if node["state"] is None:  # an end that arrived first stays the end
        node["state"] = "granted"
    totals = state["gpu_milli_granted"]
    totals[allocation["tenant"]] = totals.get(allocation["tenant"], 0) + milli
    return str(node["state"])


def apply_ended(verb: str) -> Callable[[State, Payload], str]:
    def apply(state: State, payload: Payload) -> str:
        node = node_record(state, payload)
        if node["state"] not in ENDED:
            node.update(state=verb, ended_at=payload.get("occurred_at"), reason=payload.get("reason", verb))
        return str(node["state"])

    return apply


# The ce-types this subscriber understands. A newer version (.v2) is held, not dropped: upgrade.
EFFECTS: dict[str, Callable[[State, Payload], str]] = {
    "io.ibpool.pool.allocation.granted.v1": apply_granted,
    **{f"io.ibpool.pool.allocation.{verb}.v1": apply_ended(verb) for verb in sorted(ENDED)},
}


# -- state file ---------------------------------------------------------------------------------


def load_state(path: Path) -> State:
    if not path.exists():
        return {"allocations": {}, "gpu_milli_granted": {}, "processed": [], "last_stream_seq": 0}
    state: State = json.loads(path.read_text(encoding="utf-8"))
    return state


def save_state(path: Path, state: State) -> None:
    """Write to a temporary file, fsync, rename over the old one, fsync the folder: all or nothing."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(state, f, sort_keys=True, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_state(path: Path) -> int:
    """One subscriber per state file: hold an exclusive lock beside it for the life of the process."""
    fd = os.open(path.with_name(path.name + ".lock"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"another subscriber holds {path}; run one per state file")
    return fd


def load_validators(directory: Path) -> dict[str, Draft202012Validator]:
    validators = {}
    for verb in VERBS:
        for file in sorted(directory.glob(f"io.ibpool.pool.allocation.{verb}.v*.json")):
            schema = json.loads(file.read_text(encoding="utf-8"))
            Draft202012Validator.check_schema(schema)
            validators[file.stem] = Draft202012Validator(schema)
    if not validators:
        sys.exit(f"no allocation event schemas in {directory}; pass --schemas docs/events/schemas")
    return validators


# -- the consumer -------------------------------------------------------------------------------


class Subscriber:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.validators = load_validators(args.schemas)
        self.state = load_state(args.state)
        self.processed: set[str] = set(self.state["processed"])
        self.applied = 0
        self.crash_after = int(os.environ.get(CRASH_ENV, "0") or 0)

    async def handle(self, msg: Msg) -> None:
        headers = msg.headers or {}
        meta = msg.metadata
        where = f"seq={meta.sequence.stream} delivery={meta.num_delivered}"
        ce_id = headers.get("ce-id") or headers.get("Nats-Msg-Id") or ""
        ce_type = headers.get("ce-type") or ""
        try:
            payload = json.loads(msg.data)
        except ValueError as e:
            return await self.reject(msg, f"not JSON ({e})", where, ce_type, ce_id)
        if not isinstance(payload, dict):
            return await self.reject(msg, "payload is not an object", where, ce_type, ce_id)
        ce_id = ce_id or str(payload.get("id") or "")
        ce_type = ce_type or str(payload.get("type") or "")
        if not ce_id:
            return await self.reject(msg, "no ce-id header and no id: cannot deduplicate", where, ce_type)
        if ce_id in self.processed:
            await msg.ack_sync()
            return say("duplicate", ce_type, ce_id, where, "already applied; acked, no effect")
        validator, effect = self.validators.get(ce_type), EFFECTS.get(ce_type)
        if validator is None or effect is None:
            # A type we do not know yet (say a .v2): keep it in the stream until we are upgraded.
            await msg.nak(delay=HOLD_UNKNOWN_S)
            return say("held", ce_type, ce_id, where, "unknown type; upgrade the subscriber and schemas")
        errors = sorted(validator.iter_errors(payload), key=lambda e: list(e.absolute_path))
        if errors or payload.get("type") != ce_type:
            problem = errors[0].message if errors else f"payload type {payload.get('type')!r} != ce-type"
            return await self.reject(msg, f"schema: {problem}", where, ce_type, ce_id)

        new_state = effect(self.state, payload)
        self.processed.add(ce_id)
        self.state["processed"].append(ce_id)
        del self.state["processed"][: -self.args.keep_ids]
        self.state["last_stream_seq"] = max(self.state["last_stream_seq"], meta.sequence.stream)
        save_state(self.args.state, self.state)  # durable before the ack
        self.applied += 1
        if self.crash_after and self.applied >= self.crash_after:
            say("crash", ce_type, ce_id, where, f"{CRASH_ENV}: state written, exiting before the ack")
            os._exit(CRASH_EXIT)
        await msg.ack_sync()
        say(
            "applied",
            ce_type,
            ce_id,
            where,
            f"allocation={payload['allocation_id']} node={payload['node_id']} state={new_state}",
        )

    async def reject(self, msg: Msg, why: str, where: str, ce_type: str = "?", ce_id: str = "?") -> None:
        await msg.term()  # a payload that breaks the contract will not get better on redelivery
        say("invalid", ce_type, ce_id, where, why)


def say(outcome: str, ce_type: str, ce_id: str, where: str, detail: str) -> None:
    print(f"{outcome} {ce_type} ce-id={ce_id} {where} {detail}", flush=True)


def filter_subjects(key: str | None) -> list[str]:
    return [f"{SUBJECT_ROOT}.{verb}.{key or '*'}" for verb in VERBS]


async def bind(js: Any, args: argparse.Namespace) -> Any:
    config = ConsumerConfig(
        durable_name=args.durable,
        deliver_policy=DeliverPolicy.ALL,  # first run: from the start of the stream
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=args.ack_wait,
        max_ack_pending=256,
        filter_subjects=filter_subjects(args.key),
    )
    try:
        await js.add_consumer(STREAM, config)
    except nats.js.errors.NotFoundError:
        sys.exit(f"stream {STREAM} not found: is ibpool running against {args.nats}?")
    except nats.js.errors.BadRequestError as e:
        # The durable exists with other settings. Keep it: recreating it would lose its position.
        print(f"note: keeping the existing consumer {args.durable!r} ({e.description})", file=sys.stderr)
    return await js.pull_subscribe_bind(args.durable, stream=STREAM)


def inbox_of(url: str) -> str:
    """ibpool's NATS users may subscribe only to their own inboxes, `_INBOX_<user>`; `_INBOX` without a user."""
    user = urllib.parse.urlsplit(url.split(",")[0].strip()).username
    return f"_INBOX_{user}" if user else "_INBOX"


async def run(args: argparse.Namespace) -> int:
    lock = lock_state(args.state)
    subscriber = Subscriber(args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        nc = await nats.connect(
            args.nats,
            name=f"subscriber-{args.durable}",
            connect_timeout=5,
            max_reconnect_attempts=-1,
            inbox_prefix=args.inbox_prefix or inbox_of(args.nats),
        )
    except Exception as e:  # nats-py raises several unrelated types here
        print(f"cannot connect to {args.nats}: {e!r}", file=sys.stderr)
        return 1
    psub = None
    try:
        psub = await bind(nc.jetstream(), args)
        handled, last_new = 0, time.monotonic()
        wait_s = min(1.0, args.idle_exit) if args.idle_exit else 1.0
        while not stop.is_set() and (args.max is None or handled < args.max):
            # Never fetch more than we will handle: an unhandled fetched message waits out ack_wait.
            batch = 16 if args.max is None else min(16, args.max - handled)
            try:
                msgs = await psub.fetch(batch, timeout=wait_s)
            except (nats.errors.TimeoutError, TimeoutError):
                if args.idle_exit is not None and time.monotonic() - last_new >= args.idle_exit:
                    break
                continue
            for msg in msgs:
                await subscriber.handle(msg)
                handled += 1
            last_new = time.monotonic()
        print(
            f"done: {handled} message(s), {subscriber.applied} applied, "
            f"{len(subscriber.state['allocations'])} allocation(s) in {args.state}",
            flush=True,
        )
        return 0
    finally:
        # Every ack was confirmed (ack_sync). Unsubscribe before draining: nats-py's drain otherwise
        # waits out its whole timeout after a fetch that timed out.
        with contextlib.suppress(Exception):
            if psub is not None:
                await psub.unsubscribe()
            await nc.drain()
        os.close(lock)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Apply ibpool allocation events to a state file, once each.")
    p.add_argument("--nats", default=os.environ.get("IBPOOL_NATS_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--durable", required=True, help="consumer name; one per subscribing system")
    p.add_argument(
        "--inbox-prefix",
        default="",
        help="where replies come; default _INBOX_<user> for a URL naming a user (the only inboxes it may read)",
    )
    p.add_argument("--state", required=True, type=Path, help="JSON state file (created if missing)")
    p.add_argument("--max", type=int, default=None, help="exit after this many messages")
    p.add_argument("--idle-exit", type=float, default=None, help="exit after S seconds with nothing new")
    p.add_argument("--key", default=None, help="only this subject key (a node id); default: all nodes")
    p.add_argument("--ack-wait", type=float, default=30.0, help="redelivery delay of an unacked message (s)")
    p.add_argument("--keep-ids", type=int, default=100_000, help="how many handled ce-ids to remember")
    p.add_argument("--schemas", type=Path, default=DEFAULT_SCHEMAS, help="the published JSON Schemas")
    args = p.parse_args(argv)
    if args.max is not None and args.max < 1:
        p.error("--max must be at least 1")
    if args.key is not None and (not args.key or any(c in args.key for c in ". *>\t\r\n")):
        p.error("--key must be one subject token (no '.', '*', '>' or spaces)")
    return args


def main() -> int:
    return asyncio.run(run(parse_args()))


if __name__ == "__main__":
    sys.exit(main())
