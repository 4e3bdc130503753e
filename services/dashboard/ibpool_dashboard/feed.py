"""The bus as the dashboard hears it, for every browser at once.

`Feed.tail` reads every stream's events through one ephemeral pull consumer per stream (no acks,
gone a minute after the dashboard stops: it owns nothing on the bus), from the newest `backlog` on,
keeps the newest `recent` of them and hands each new one to every `/events` listener. State that
the next message replaces (GPU telemetry, HCA ports, a deployment's load) is not history: it is
left out of the event stream; telemetry is followed with the runtime's `follow_latest` instead,
newest per node, for the GPU grid. `job_events` reads one job's events (and its allocation's) for
its page.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterator
from typing import Any

import msgspec
import nats.errors
from nats.aio.msg import Msg

from ibpool_proto import ALL_MESSAGES
from ibpool_proto.message import Message
from ibpool_proto.node import HcaPortsReported, TelemetryReported
from ibpool_proto.scale import DeploymentMetricsReported
from ibpool_runtime.bus import Bus, Rejected, decode_delivered
from ibpool_runtime.follow import follow_latest, tail_subscription
from ibpool_runtime.logs import get_logger
from ibpool_runtime.outages import OUTAGES
from ibpool_runtime.service import sleep_unless_stopped
from ibpool_runtime.streams import stream_for_subject

from .views import EventRow, event_row

log = get_logger(__name__)

# Replaced by the next one of their subject: not shown as events (telemetry is followed apart).
STATE_MESSAGES: tuple[type[Message], ...] = (TelemetryReported, HcaPortsReported, DeploymentMetricsReported)
LISTENER_QUEUE = 1000
JOB_EVENTS_MAX = 500


def event_subjects() -> dict[str, list[str]]:
    """Stream -> the subject patterns of the events shown (every stored message but STATE_MESSAGES)."""
    out: dict[str, set[str]] = {}
    for m in ALL_MESSAGES:
        if m.stored and m not in STATE_MESSAGES:
            out.setdefault(stream_for_subject(m.subject_pattern()), set()).add(m.subject_pattern())
    return {stream: sorted(subjects) for stream, subjects in sorted(out.items())}


def row_of(msg: Msg, seq: int) -> EventRow | None:
    """A delivered message as an event row; None (logged) for one that does not decode or came on
    another subject than its type and key build."""
    message = decode_delivered(msg)
    if isinstance(message, Rejected):
        log.warning("message dropped", subject=msg.subject, why=message.why, error=message.error)
        return None
    return event_row(
        seq,
        type(message).__name__,
        message.key,
        msg.subject,
        msgspec.to_builtins(message),
        (msg.headers or {}).get("traceparent"),
    )


class Feed:
    def __init__(self, recent: int = 500, backlog: int = 2000) -> None:
        self.recent: deque[EventRow] = deque(maxlen=recent)
        self.backlog = backlog
        self.telemetry: dict[str, dict[str, Any]] = {}
        self.listeners: set[asyncio.Queue[EventRow]] = set()
        self.seq = 0
        self.following = False

    def add(self, msg: Msg) -> EventRow | None:
        row = row_of(msg, self.seq + 1)
        if row is None:
            return None
        self.seq += 1
        self.recent.append(row)
        for q in list(self.listeners):
            try:
                q.put_nowait(row)
            except asyncio.QueueFull:  # a browser that stopped reading: it misses events, nobody waits
                self.listeners.discard(q)
        return row

    @contextlib.contextmanager
    def listen(self) -> Iterator[asyncio.Queue[EventRow]]:
        """A queue that gets every event from now on, while the `with` lasts."""
        q: asyncio.Queue[EventRow] = asyncio.Queue(LISTENER_QUEUE)
        self.listeners.add(q)
        try:
            yield q
        finally:
            self.listeners.discard(q)

    def on_telemetry(self, message: object) -> None:
        if isinstance(message, TelemetryReported):
            self.telemetry[message.node_id] = msgspec.to_builtins(message)

    async def follow_telemetry(self, bus: Bus, stop: asyncio.Event) -> None:
        await follow_latest(bus, TelemetryReported.subject_pattern(), stop, self.on_telemetry)

    async def tail(self, bus: Bus, stop: asyncio.Event) -> None:
        """Every stream's events from the newest `backlog` on, until `stop`; consumers the server
        dropped (a reconnect) are made again from where this one got to."""
        subs: dict[str, Any] = {}
        next_seq: dict[str, int] = {}
        while not stop.is_set():
            try:
                for stream, subjects in event_subjects().items():
                    if stream in subs:
                        continue
                    subs[stream], next_seq[stream] = await tail_subscription(
                        bus, stream, subjects, back=self.backlog, start_seq=next_seq.get(stream)
                    )
                self.following = True
                got = 0
                for stream, sub in list(subs.items()):
                    try:
                        msgs = await sub.fetch(batch=200, timeout=0.2)
                    except (nats.errors.TimeoutError, TimeoutError):
                        continue
                    for m in msgs:
                        next_seq[stream] = m.metadata.sequence.stream + 1
                        got += 1
                        self.add(m)
                if not got:
                    await sleep_unless_stopped(stop, 0.1)
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError):
                break
            except OUTAGES as e:  # the server dropped a consumer or is away: make them again
                log.warning("event tail failed; resubscribing", error=str(e) or type(e).__name__)
                self.following = False
                subs.clear()
                await sleep_unless_stopped(stop, 1.0)
        for sub in subs.values():
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


def job_subjects(job_id: str) -> list[str]:
    """The subjects of the job domain's messages keyed by a job (its submission, queueing,
    scheduling, preemption, requeue, end; a job's start and exit are keyed by their node)."""
    return sorted({m.subject(job_id) for m in ALL_MESSAGES if m.stored and m.key_name == "job_id"})


async def job_events(bus: Bus, job_id: str) -> list[EventRow]:
    """One job's stored events (its own domain's, its placements, its health verdicts), oldest first,
    at most JOB_EVENTS_MAX per stream."""
    by_stream: dict[str, list[str]] = {}
    for subject in job_subjects(job_id):
        by_stream.setdefault(stream_for_subject(subject), []).append(subject)
    rows: list[EventRow] = []
    for stream, subjects in sorted(by_stream.items()):
        sub, _ = await tail_subscription(bus, stream, subjects, start_seq=1)  # all of them
        got: list[EventRow] = []
        try:
            while len(got) < JOB_EVENTS_MAX:
                try:
                    msgs = await sub.fetch(batch=100, timeout=0.3)
                except (nats.errors.TimeoutError, TimeoutError):
                    break
                got += [r for m in msgs if (r := row_of(m, m.metadata.sequence.stream)) is not None]
                if msgs[-1].metadata.num_pending == 0:
                    break
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        rows += got[:JOB_EVENTS_MAX]
    return sorted(rows, key=lambda r: r.at or "")
