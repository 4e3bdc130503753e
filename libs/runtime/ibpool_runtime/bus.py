"""The bus: nats-py JetStream with CloudEvents headers, dedup ids, trace context and a DLQ.

Publishing sets `Nats-Msg-Id` = event id (JetStream drops duplicates inside the stream's window),
the CloudEvents binary-mode headers and W3C `traceparent`. A batch (the outbox relay's) goes out as
one JetStream atomic batch per stream that allows them (nats-server 2.12+, `allow_atomic`) when it
has `ATOMIC_BATCH_MIN` messages or more for that stream: stored together, which with
`sync_interval: always` spares most of the per-message fsyncs. Otherwise, and for a batch the
server refuses, with `publish_async` under a bounded in-flight window; every ack is awaited.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Literal, NamedTuple

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import PubAck, RetentionPolicy, StorageType, StreamConfig

from ibpool_proto import DecodeError, Message, decode, encode, misaddressed

from . import telemetry
from .logs import get_logger
from .metrics import ServiceMetrics, count_failure
from .outages import OUTAGES
from .streams import DLQ_SUBJECT_PREFIX, STREAMS, StreamSpec, stream_for_subject

log = get_logger(__name__)

# What reading a delivered message's JetStream metadata (`Msg.metadata`) raises when its reply
# subject is not one of JetStream's (`NotJSMessageError`) or does not parse (numbers, a timestamp).
BAD_METADATA: tuple[type[Exception], ...] = (nats.errors.Error, ValueError, IndexError, OverflowError, OSError)

CE_SPECVERSION = "1.0"
CONTENT_TYPE = "application/json"


class OutgoingMessage(NamedTuple):
    """A message ready for the wire: what the outbox stores and the relay publishes."""

    subject: str
    headers: dict[str, str]
    body: bytes


def envelope_headers(message: Message, *, with_trace: bool = True) -> dict[str, str]:
    """The NATS headers of a message: dedup id, CloudEvents binary mode, trace context."""
    headers = {
        "Nats-Msg-Id": message.id,
        "ce-specversion": CE_SPECVERSION,
        "ce-id": message.id,
        "ce-source": message.source,
        "ce-type": message.ce_type(),
        "ce-time": message.occurred_at.isoformat(),
        "ce-subject": message.key,
        "content-type": CONTENT_TYPE,
    }
    if with_trace:
        telemetry.inject(headers)
    return headers


# JetStream's limit on the messages of one atomic batch (nats-server's default `max_msgs`).
ATOMIC_BATCH_MAX = 1000
# Fewer messages for one stream go one by one: measured with bench_sched, atomic batches raised the
# throughput of bursts by a fifth but cost nats-server more CPU when the batches were a few messages.
ATOMIC_BATCH_MIN = 16


class Rejected(NamedTuple):
    """A delivered message that is not acted on: `why` "decode" (not one of our messages) or
    "subject" (its type and key build another subject than the one it came on)."""

    why: Literal["decode", "subject"]
    error: str


def decode_delivered(msg: Msg) -> Message | Rejected:
    """What `msg` carries, decoded once and checked against the subject it arrived on (the subject is
    what the publisher was allowed to use, so a body of another type or key there is never trusted)."""
    try:
        message = decode(msg.data)
    except DecodeError as e:
        return Rejected("decode", str(e))
    wrong = misaddressed(message, msg.subject, (msg.headers or {}).get("ce-type"))
    return message if wrong is None else Rejected("subject", wrong)


class AtomicBatchRefused(Exception):
    """The server stored none of an atomic batch (e.g. it holds one of its message ids already)."""


def outgoing(message: Message) -> OutgoingMessage:
    return OutgoingMessage(message.subject_of(), envelope_headers(message), encode(message))


class BusUnavailable(Exception):
    """NATS could not be reached after the configured retries."""


INBOX_PREFIX = "_INBOX"


def inbox_prefix(user: str | None) -> str:
    """Where `user`'s replies come (`_INBOX_<user>`; `_INBOX` without a user): each NATS user may
    subscribe only to its own inboxes, so no client reads the replies meant for another."""
    return f"{INBOX_PREFIX}_{user}" if user else INBOX_PREFIX


def url_user(url: str) -> str | None:
    """The NATS user named in the first server of `url` (`nats://user:password@host`), if any."""
    first = url.split(",")[0].strip()
    try:
        return urllib.parse.urlsplit(first if "://" in first else f"nats://{first}").username or None
    except ValueError:
        return None


def redact_url(text: str) -> str:
    """`nats://user:secret@host` -> `nats://user:***@host`, for every URL in `text`."""
    return re.sub(r"://([^:@/,\s]+):[^@/,\s]*@", r"://\1:***@", text)


class StreamSetupError(Exception):
    """A stream is missing or differs from its declaration, and this connection may not fix it."""


def _same_stream(current: StreamConfig, wanted: StreamConfig) -> bool:
    def seconds(v: float | None) -> float:
        return round(float(v or 0.0), 3)

    return (
        sorted(current.subjects or []) == sorted(wanted.subjects or [])
        and seconds(current.max_age) == seconds(wanted.max_age)
        and seconds(current.duplicate_window) == seconds(wanted.duplicate_window)
        and (current.num_replicas or 1) == (wanted.num_replicas or 1)
        and (current.max_bytes or -1) == (wanted.max_bytes or -1)
        and current.retention == wanted.retention
        and (current.description or "") == (wanted.description or "")
    )


Listener = Callable[[], Awaitable[None]]


class Bus:
    def __init__(self, nc: NatsClient, js: JetStreamContext, reconnect_listeners: list[Listener] | None = None) -> None:
        self.nc = nc
        self.js = js
        self._reconnect_listeners = reconnect_listeners if reconnect_listeners is not None else []
        # Streams whose config, as the server reported it in `ensure_streams`, allows atomic batches.
        self.atomic_streams: set[str] = set()
        # How `connect` reached the servers, for `connect_again` (empty: not made by `connect`).
        self.url = ""
        self.tls_ca = ""
        self.metrics: ServiceMetrics | None = None

    def on_reconnect(self, listener: Listener) -> None:
        """Call `listener` after every reconnect (e.g. to re-announce state others may have missed)."""
        self._reconnect_listeners.append(listener)

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        attempts: int = 10,
        backoff_s: float = 0.5,
        window: int = 256,
        tls_ca: str = "",
        metrics: ServiceMetrics | None = None,
    ) -> Bus:
        """Connect with bounded retries; raise BusUnavailable naming the URL when all fail.

        `url` may list several servers of a cluster, comma-separated; passwords in it never reach logs.
        The user it names gets its replies on its own inbox prefix (`inbox_prefix`), the only one its
        permissions let it read. With `tls_ca` (a PEM file) the servers are verified against that CA
        over TLS. `metrics` counts failed attempts and failed reconnect listeners (`ibpool_loop_failures`).
        """
        tls = None
        if tls_ca:
            try:
                tls = ssl.create_default_context(cafile=tls_ca)
            except (OSError, ssl.SSLError) as e:
                raise BusUnavailable(f"cannot use {tls_ca} as the NATS CA: {e}") from None
        servers = [u.strip() for u in url.split(",") if u.strip()]
        shown = redact_url(url)
        last: Exception | None = None
        seen: list[Exception] = []
        listeners: list[Listener] = []

        async def on_reconnected() -> None:
            log.info("nats reconnected", url=shown)
            for listener in list(listeners):
                try:
                    await listener()
                except Exception as e:
                    # Any error, not only an outage: one listener's failure must not stop the others,
                    # and this runs in nats-py's reconnect task, which an error escaping here would end.
                    count_failure(metrics, "nats reconnect listener", e)
                    log.warning("reconnect listener failed", error=str(e) or type(e).__name__, exc_info=e)

        async def on_error(e: Exception) -> None:
            seen.append(e)
            await _log_nats_error(e)

        for attempt in range(1, attempts + 1):
            try:
                # nats-py keeps retrying a first connect as if it were a reconnect; bound each attempt.
                nc = await asyncio.wait_for(
                    nats.connect(
                        servers,
                        name=name,
                        connect_timeout=2,
                        allow_reconnect=True,
                        max_reconnect_attempts=-1,
                        reconnect_time_wait=0.5,
                        error_cb=on_error,
                        reconnected_cb=on_reconnected,
                        tls=tls,
                        inbox_prefix=inbox_prefix(url_user(url)),
                    ),
                    timeout=3,
                )
                bus = cls(nc, nc.jetstream(publish_async_max_pending=window), listeners)
                bus.url, bus.tls_ca, bus.metrics = url, tls_ca, metrics
                return bus
            except OUTAGES as e:  # nats-py raises OSError, TimeoutError and its own errors (a bad URL too)
                count_failure(metrics, "nats connect", e)
                last = seen[-1] if isinstance(e, TimeoutError) and seen else e
                error = redact_url(str(e)) or type(e).__name__
                log.warning("nats connect failed", url=shown, attempt=attempt, error=error)
                await asyncio.sleep(min(backoff_s * 2 ** (attempt - 1), 5.0))
        raise BusUnavailable(f"cannot reach NATS at {shown} after {attempts} attempts: {redact_url(str(last))}")

    async def connect_again(self, name: str) -> Bus:
        """Another connection to the same servers as the same user (a follower of its own, in a thread)."""
        if not self.url:
            raise BusUnavailable("this bus was not made by Bus.connect: no URL to connect again to")
        return await Bus.connect(self.url, name=name, tls_ca=self.tls_ca, metrics=self.metrics)

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    async def ensure_streams(self, replicas: int = 1, specs: Iterable[StreamSpec] = STREAMS) -> None:
        """Create or update every stream of the table; safe to run from every service at start.

        A stream already in place with the declared settings is left alone, so services whose
        NATS user may only read streams start against streams the admin created.
        """
        may_update = True
        for spec in specs:
            config = StreamConfig(
                name=spec.name,
                subjects=list(spec.subjects),
                max_age=spec.max_age_s,
                duplicate_window=spec.duplicate_window_s,
                num_replicas=replicas,
                max_bytes=spec.max_bytes,
                description=spec.description,
                retention=RetentionPolicy(spec.retention),
                storage=StorageType.FILE,
                allow_atomic=True,
            )
            try:
                current = (await self.js.stream_info(spec.name)).config
            except nats.js.errors.NotFoundError:
                current = None
            except nats.errors.TimeoutError as e:  # what a refused request looks like
                raise StreamSetupError(
                    f"cannot read stream {spec.name} (does this NATS user lack the permission?)"
                ) from e
            if current is not None and _same_stream(current, config):
                # In place as declared: a service whose user may not change streams goes on. A stream
                # created before atomic batches were asked for gets them where this user may update
                # it; otherwise batches to it are published message by message.
                if not current.allow_atomic and may_update:
                    try:  # a refused request only times out: ask briefly, and once
                        current = (await asyncio.wait_for(self.js.update_stream(config), timeout=1.0)).config
                    except (TimeoutError, nats.errors.TimeoutError, nats.js.errors.APIError):
                        may_update = False
            else:
                try:
                    made = await (self.js.add_stream(config) if current is None else self.js.update_stream(config))
                except (nats.errors.TimeoutError, nats.js.errors.APIError) as e:
                    what = (
                        f"create stream {spec.name}"
                        if current is None
                        else f"bring stream {spec.name} to its declared settings"
                    )
                    raise StreamSetupError(
                        f"cannot {what} (does this NATS user have the admin's permissions?): {e or type(e).__name__}"
                    ) from e
                current = made.config
            if current.allow_atomic:
                self.atomic_streams.add(spec.name)

    async def publish(self, message: Message) -> PubAck:
        out = outgoing(message)
        return await self.js.publish(out.subject, out.body, headers=out.headers)

    async def publish_unacked(self, message: Message) -> None:
        """For telemetry-class messages: a core NATS publish, no ack awaited (a lost sample is replaced by the
        next); JetStream stores it where a stream holds its subject (telemetry), not otherwise (heartbeats)."""
        out = outgoing(message)
        await self.nc.publish(out.subject, out.body, headers=out.headers)

    async def publish_batch(self, batch: Sequence[OutgoingMessage], timeout_s: float = 10.0) -> None:
        """Publish every message, in order within each stream, and return once JetStream has stored all.

        `ATOMIC_BATCH_MIN` or more messages of one stream in `atomic_streams` go as atomic batches;
        a batch the server refuses goes again message by message, where JetStream drops the copies
        of messages it holds already by `Nats-Msg-Id` (a relay that published and stopped before
        deleting its rows publishes them again). Messages of different streams were never ordered
        among each other.
        """
        by_stream: dict[str | None, list[OutgoingMessage]] = {}
        for m in batch:
            by_stream.setdefault(self._atomic_stream_of(m.subject), []).append(m)
        sends = [self._publish_stream(stream, msgs, timeout_s) for stream, msgs in by_stream.items()]
        await asyncio.wait_for(asyncio.gather(*sends), timeout=timeout_s)

    def _atomic_stream_of(self, subject: str) -> str | None:
        try:
            stream = stream_for_subject(subject)
        except KeyError:
            return None
        return stream if stream in self.atomic_streams else None

    async def _publish_stream(self, stream: str | None, msgs: list[OutgoingMessage], timeout_s: float) -> None:
        if stream is None or len(msgs) < ATOMIC_BATCH_MIN:
            await self._publish_each(msgs)
            return
        for start in range(0, len(msgs), ATOMIC_BATCH_MAX):
            chunk = msgs[start : start + ATOMIC_BATCH_MAX]
            try:
                await self._publish_atomic(chunk, timeout_s)
            except AtomicBatchRefused as e:
                log.info("atomic batch refused; publishing it message by message", stream=stream, error=str(e))
                await self._publish_each(chunk)

    async def _publish_each(self, msgs: Sequence[OutgoingMessage]) -> None:
        futures = [await self.js.publish_async(m.subject, m.body, headers=m.headers) for m in msgs]
        if futures:
            await asyncio.gather(*futures)

    async def _publish_atomic(self, msgs: Sequence[OutgoingMessage], timeout_s: float) -> None:
        """One atomic batch (ADR-50): every message carries the batch id and its place in the batch,
        the last one commits; only the commit asks for a reply, the pub ack of the whole batch."""
        batch_id = uuid.uuid4().hex
        last = len(msgs)
        for i, m in enumerate(msgs[:-1], 1):
            headers = {**m.headers, "Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(i)}
            await self.nc.publish(m.subject, m.body, headers=headers)
        m = msgs[-1]
        headers = {**m.headers, "Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(last), "Nats-Batch-Commit": "1"}
        reply = await self.nc.request(m.subject, m.body, timeout=timeout_s, headers=headers)
        try:
            ack = json.loads(reply.data)
        except ValueError:
            raise AtomicBatchRefused(f"not a pub ack: {reply.data[:200]!r}") from None
        if ack.get("error") or ack.get("batch") != batch_id or ack.get("count") != last:
            raise AtomicBatchRefused(str(ack.get("error") or ack))

    async def dead_letter(self, msg: Msg, *, consumer: str, reason: str, deliveries: int) -> None:
        """Copy a message to IBPOOL_DLQ with its original subject, headers and why it is there.

        Headers that steer JetStream (`Nats-*`: expected stream or sequence, rollup, TTL, message id,
        batch) are not passed on as such, or a crafted one could make the DLQ refuse the copy (the
        message then dropped after its last delivery): each goes as `ibpool-dlq-header-<name>`."""
        headers = dlq_headers(msg.headers or {})
        try:
            seq = msg.metadata.sequence.stream
        except BAD_METADATA:  # not a JetStream message (never so from a pull consumer): sequence 0 in its id
            seq = 0
        headers.update(
            {
                "Nats-Msg-Id": f"dlq.{consumer}.{seq}.{headers.get('ce-id', '')}",
                "ibpool-dlq-subject": msg.subject,
                "ibpool-dlq-consumer": consumer,
                "ibpool-dlq-reason": reason[:2000].replace("\n", " "),
                "ibpool-dlq-deliveries": str(deliveries),
            }
        )
        await self.js.publish(f"{DLQ_SUBJECT_PREFIX}.{consumer}", msg.data, headers=headers)

    async def close(self) -> None:
        """Drain: flush what is buffered, let subscriptions finish, then close."""
        if self.nc.is_closed:
            return
        try:
            await asyncio.wait_for(self.nc.drain(), timeout=5)
        except (TimeoutError, nats.errors.ConnectionClosedError):
            await self.nc.close()


def dlq_headers(original: Mapping[str, str]) -> dict[str, str]:
    """The original headers of a dead letter, every JetStream-steering `Nats-*` one renamed."""
    out: dict[str, str] = {}
    for name, value in original.items():
        out[f"ibpool-dlq-header-{name}" if name.lower().startswith("nats-") else name] = value
    return out


async def _log_nats_error(e: Exception) -> None:
    log.warning("nats error", error=str(e) or type(e).__name__)
