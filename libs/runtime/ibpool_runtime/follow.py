"""Following state that the newest message replaces: from the last message of every subject on.

Telemetry and link verdicts are state, not history: what a follower needs is the newest
message of each subject, then every new one. `follow_latest` reads them with an ephemeral pull
consumer (`LAST_PER_SUBJECT`, no acks, gone `inactive_s` after the follower stops), so a restart
never replays a backlog that would make live nodes look silent while it is read. A consumer the
server dropped (a reconnect, inactivity) is made again; a message that does not decode, or whose
subject is not the one its type and key build (`ibpool_proto.misaddressed`), is logged and skipped.
One loop for every such follower (the scheduler's node and fabric news, the failover controller's
telemetry). Messages that are not stored at all (heartbeats, `ibpool_proto.Message.stored`) are
followed live on core NATS by `follow_live_in_thread` on a connection and a thread of their own
(a service's loop may be busy for longer than nats-server waits for a reader), into `Arrivals`,
the newest of each subject, which the service takes and decodes (`decode_arrivals`, with the same
checks) with the same progress reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable

import nats.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from .bus import BAD_METADATA, Bus, BusUnavailable, Rejected, decode_delivered
from .logs import get_logger
from .metrics import ServiceMetrics, count_failure
from .outages import OUTAGES
from .service import sleep_unless_stopped
from .streams import stream_for_subject

log = get_logger(__name__)

BATCH = 512
INACTIVE_S = 10.0


async def follow_latest(
    bus: Bus,
    pattern: str,
    stop: asyncio.Event,
    handle: Callable[[object], None],
    *,
    batch: int = BATCH,
    inactive_s: float = INACTIVE_S,
    progress: Callable[[float, float], None] | None = None,
    metrics: ServiceMetrics | None = None,
) -> None:
    """Call `handle` with every decoded message of `pattern`, from the newest of each subject on,
    until `stop` is set or the connection closes. `handle` must not block (it runs on the loop).

    `progress(t, stored_late_s)`, after each fetch: every message stored before `t` (POSIX seconds,
    wall clock) has been handed to `handle`. When the consumer had nothing more pending, `t` is
    when the fetch was asked for; while it is behind, `t` is when the last message it handed over
    was stored, so a follower that falls behind its input knows by how much (now - t).
    `stored_late_s` is how long after their `occurred_at` the messages of the fetch were stored, at
    most (0 for an empty fetch): the delay before the follower could see them at all (a publisher
    starved of CPU, a server slow to store). A message created at c is read once t >= c + that.

    A failed fetch (the bus away, the consumer dropped by the server) is counted in `metrics`
    (`ibpool_loop_failures{loop="follow <pattern>"}`) and the consumer made anew."""
    sub = None
    while not stop.is_set():
        asked = time.time()
        try:
            if sub is None:
                sub = await bus.js.pull_subscribe(
                    pattern,
                    stream=stream_for_subject(pattern),
                    config=ConsumerConfig(
                        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                        ack_policy=AckPolicy.NONE,
                        inactive_threshold=inactive_s,
                    ),
                )
            msgs = await sub.fetch(batch, timeout=0.5)
        except (nats.errors.TimeoutError, TimeoutError):
            if progress is not None and sub is not None:
                progress(asked, 0.0)  # nothing came for a whole fetch: nothing was pending when it was asked
            continue
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError):
            break
        except OUTAGES as e:  # the server dropped the consumer (reconnect, inactivity): start anew
            count_failure(metrics, f"follow {pattern}", e)
            log.warning("following failed; resubscribing", subject=pattern, error=str(e) or type(e).__name__)
            sub = None
            await sleep_unless_stopped(stop, 0.5)
            continue
        late = 0.0
        for m in msgs:
            message = decode_delivered(m)
            if isinstance(message, Rejected):
                log.warning("message dropped", subject=m.subject, why=message.why, error=message.error)
                continue
            if progress is not None:
                late = max(late, _stored_late(m, message.occurred_at.timestamp()))
            handle(message)
        if progress is not None and msgs:
            progress(_read_until(msgs[-1], asked), late)
    if sub is not None:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


def _stored_late(m: Msg, occurred_at: float) -> float:
    """How long after it occurred `m` was stored (0 when unknown or when its clock runs ahead)."""
    try:
        return max(0.0, m.metadata.timestamp.timestamp() - occurred_at)
    except BAD_METADATA:  # no JetStream metadata: not known
        return 0.0


def _read_until(last: Msg, asked: float) -> float:
    """What `progress` is told after a batch ending with `last`: `asked` when nothing was pending
    after it, else when `last` was stored (`asked` at most)."""
    try:
        meta = last.metadata
    except BAD_METADATA:  # no JetStream metadata: claim no progress beyond what is certain
        return 0.0
    if meta.num_pending == 0:
        return asked
    return min(asked, meta.timestamp.timestamp())


# Messages a live follower may hold unread before nats-py drops them (a slow consumer): about 40 s
# of heartbeats at 12,500 nodes.
LIVE_PENDING = 500_000


async def follow_live(
    bus: Bus,
    pattern: str,
    stop: asyncio.Event,
    arrived: Callable[[Msg], None],
    *,
    every_s: float = 0.25,
    progress: Callable[[float], None] | None = None,
) -> None:
    """Call `arrived` with every message of `pattern` published on core NATS from now on (for
    messages that are not stored, `ibpool_proto.Message.stored`), as it came, until `stop`.

    `progress(t)`, every `every_s`: every message the server had sent this subscriber by `t` (POSIX
    seconds, wall clock; a PING answered after them proves it) has been handed to `arrived`."""
    # (how many arrivals must be handled, set once they are) while a progress report waits.
    waiting: tuple[int, asyncio.Event] | None = None

    def handled_up_to() -> int:
        # `delivered` counts arrivals (those dropped as a slow consumer too), the queue what is left.
        return sub.delivered - sub.pending_msgs

    async def on_message(m: Msg) -> None:
        try:
            arrived(m)
        finally:
            if waiting is not None and handled_up_to() >= waiting[0]:
                waiting[1].set()

    # pending_bytes_limit=0: no limit in bytes (nats-py's convention), the count bounds it.
    sub = await bus.nc.subscribe(pattern, cb=on_message, pending_msgs_limit=LIVE_PENDING, pending_bytes_limit=0)
    try:
        while not stop.is_set():
            await sleep_unless_stopped(stop, every_s)
            if progress is None or not bus.connected:
                continue
            asked = time.time()
            try:
                await bus.nc.flush(timeout=max(1, int(every_s * 4)))
            except (nats.errors.TimeoutError, nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError):
                continue
            # Everything sent before the PONG has arrived; wait until it has been handled.
            if handled_up_to() < sub.delivered:
                waiting = (sub.delivered, asyncio.Event())
                try:
                    await asyncio.wait_for(waiting[1].wait(), timeout=every_s * 4)
                except TimeoutError:
                    continue  # far behind: no progress to report yet
                finally:
                    waiting = None
            progress(asked)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


class Arrivals:
    """The newest message of every subject as it arrived (not decoded) and when, and up to when
    every message sent has arrived: filled by `follow_live_in_thread`'s thread, taken by the
    service's loop (`take`), under a lock. Reading a message off the socket costs the reading thread
    a dict store; decoding and judging are the taker's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[float, Msg]] = {}
        self._heard_at = time.time()

    def arrived(self, m: Msg) -> None:
        at = time.time()
        with self._lock:
            self._latest[m.subject] = (at, m)

    def heard(self, until: float) -> None:
        with self._lock:
            self._heard_at = max(self._heard_at, until)

    def take(self) -> tuple[list[tuple[float, Msg]], float]:
        """(when it arrived, the message) of each subject since the last take, and the time every
        message sent before has arrived by (what the messages taken are complete up to)."""
        with self._lock:
            taken, self._latest = self._latest, {}
            return list(taken.values()), self._heard_at


def decode_arrivals(taken: list[tuple[float, Msg]]) -> tuple[list[object], float]:
    """The messages of `Arrivals.take` decoded, and how late the latest of them arrived after its
    `occurred_at` (0 when none was); what does not decode, or is not what its subject says, is logged
    and left out, as in `follow_latest`."""
    out: list[object] = []
    late = 0.0
    for at, m in taken:
        message = decode_delivered(m)
        if isinstance(message, Rejected):
            log.warning("message dropped", subject=m.subject, why=message.why, error=message.error)
            continue
        late = max(late, at - message.occurred_at.timestamp())
        out.append(message)
    return out, late


async def follow_live_in_thread(
    bus: Bus,
    pattern: str,
    stop: asyncio.Event,
    arrivals: Arrivals,
    *,
    name: str,
    every_s: float = 0.25,
) -> None:
    """`follow_live` into `arrivals` on a connection of its own to `bus`'s servers
    (`Bus.connect_again`, named `name`) and an event loop of its own, in a thread of its own, until
    `stop`: the messages are read off the socket however long the caller's loop is busy, so
    nats-server never drops the follower as a slow consumer because its service was deciding, and
    the thread does no more per message than keep it. A connection that cannot be made is tried
    again every 2 s."""
    wanted = threading.Event()  # set by the caller's loop: the thread's loop stops its follower
    failed: list[BaseException] = []

    async def main() -> None:
        inner = asyncio.Event()

        async def watch_wanted() -> None:
            await asyncio.to_thread(wanted.wait)
            inner.set()

        watcher = asyncio.create_task(watch_wanted())
        try:
            while not inner.is_set():
                try:
                    own = await bus.connect_again(name)
                except BusUnavailable as e:
                    log.warning("live follower cannot connect", pattern=pattern, error=str(e))
                    await sleep_unless_stopped(inner, 2.0)
                    continue
                try:
                    await follow_live(own, pattern, inner, arrivals.arrived, every_s=every_s, progress=arrivals.heard)
                finally:
                    await own.close()
        finally:
            wanted.set()  # ends the watcher's wait, however this loop ends
            await watcher

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as e:  # handed to the caller's loop, which raises it
            failed.append(e)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        while thread.is_alive() and not stop.is_set():
            await sleep_unless_stopped(stop, 0.25)
    finally:
        wanted.set()
        await asyncio.to_thread(thread.join)
    if failed:
        raise failed[0]


async def tail_subscription(
    bus: Bus, stream: str, subjects: list[str], *, back: int = 0, start_seq: int | None = None
) -> tuple[JetStreamContext.PullSubscription, int]:
    """A reader's tail of `stream`: an ephemeral pull consumer of `subjects` without acks (gone a
    minute after its reader stops, owning nothing on the bus) from `start_seq`, else from the newest
    `back` messages on; with the sequence it starts at. `ibpool events` and the dashboard's feed."""
    if start_seq is None:
        last = (await bus.js.stream_info(stream)).state.last_seq
        start_seq = max(1, last - back + 1)
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=start_seq,
        ack_policy=AckPolicy.NONE,
        inactive_threshold=60.0,
        filter_subjects=subjects,
    )
    return await bus.js.pull_subscribe("", stream=stream, config=config), start_seq
