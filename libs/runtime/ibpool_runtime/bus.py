"""The bus: nats-py JetStream with CloudEvents headers, dedup ids, trace context and a DLQ.

Publishing sets `Nats-Msg-Id` = event id (JetStream drops duplicates inside the stream's window),
the CloudEvents binary-mode headers and W3C `traceparent`. Batches go out with `publish_async`
under a bounded in-flight window and every ack is awaited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import PubAck, RetentionPolicy, StorageType, StreamConfig

from ibpool_proto import Message, encode

from . import telemetry
from .logs import get_logger
from .streams import DLQ_SUBJECT_PREFIX, STREAMS, StreamSpec

log = get_logger(__name__)

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


def outgoing(message: Message) -> OutgoingMessage:
    return OutgoingMessage(message.subject_of(), envelope_headers(message), encode(message))


class BusUnavailable(Exception):
    """NATS could not be reached after the configured retries."""


class Bus:
    def __init__(self, nc: NatsClient, js: JetStreamContext) -> None:
        self.nc = nc
        self.js = js

    @classmethod
    async def connect(
        cls, url: str, *, name: str, attempts: int = 10, backoff_s: float = 0.5, window: int = 256
    ) -> Bus:
        """Connect with bounded retries; raise BusUnavailable naming the URL when all fail."""
        last: Exception | None = None
        seen: list[Exception] = []

        async def on_error(e: Exception) -> None:
            seen.append(e)
            await _log_nats_error(e)

        for attempt in range(1, attempts + 1):
            try:
                # nats-py keeps retrying a first connect as if it were a reconnect; bound each attempt.
                nc = await asyncio.wait_for(
                    nats.connect(
                        url,
                        name=name,
                        connect_timeout=2,
                        allow_reconnect=True,
                        max_reconnect_attempts=-1,
                        reconnect_time_wait=0.5,
                        error_cb=on_error,
                    ),
                    timeout=3,
                )
                return cls(nc, nc.jetstream(publish_async_max_pending=window))
            except Exception as e:  # nats-py raises several unrelated types here
                last = seen[-1] if isinstance(e, TimeoutError) and seen else e
                log.warning("nats connect failed", url=url, attempt=attempt, error=str(e) or type(e).__name__)
                await asyncio.sleep(min(backoff_s * 2 ** (attempt - 1), 5.0))
        raise BusUnavailable(f"cannot reach NATS at {url} after {attempts} attempts: {last}")

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    async def ensure_streams(self, replicas: int = 1, specs: Iterable[StreamSpec] = STREAMS) -> None:
        """Create or update every stream of the table; safe to run from every service at start."""
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
            )
            try:
                await self.js.add_stream(config)
            except nats.js.errors.BadRequestError:
                # Exists with other settings: bring it to the declared ones.
                await self.js.update_stream(config)

    async def publish(self, message: Message) -> PubAck:
        out = outgoing(message)
        return await self.js.publish(out.subject, out.body, headers=out.headers)

    async def publish_unacked(self, message: Message) -> None:
        """For telemetry: stored by JetStream, but no ack is awaited (a lost sample is replaced by the next)."""
        out = outgoing(message)
        await self.nc.publish(out.subject, out.body, headers=out.headers)

    async def publish_batch(self, batch: Sequence[OutgoingMessage], timeout_s: float = 10.0) -> list[PubAck]:
        """Publish in order with `publish_async` (bounded window) and await every ack."""
        futures = [await self.js.publish_async(m.subject, m.body, headers=m.headers) for m in batch]
        if not futures:
            return []
        return list(await asyncio.wait_for(asyncio.gather(*futures), timeout=timeout_s))

    async def dead_letter(self, msg: Msg, *, consumer: str, reason: str, deliveries: int) -> None:
        """Copy a message to IBPOOL_DLQ with its original subject, headers and why it is there."""
        headers = dict(msg.headers or {})
        try:
            seq = msg.metadata.sequence.stream
        except Exception:
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


async def _log_nats_error(e: Exception) -> None:
    log.warning("nats error", error=str(e) or type(e).__name__)
