"""Durable pull consumers: decode once, handle in one transaction per batch, ack, nak or dead-letter.

A batch of fetched messages is handled in one Postgres transaction, each handler inside its own
savepoint with its inbox row, so one commit and one round of acks serve the whole batch, and a
failing handler rolls back only its own work.

Fast path: one inbox insert for the whole batch and the handlers straight in the batch
transaction. If a handler raises, that transaction is rolled back and the batch runs again with
one savepoint per event, so a handler may run twice in one delivery and must keep every effect
inside its transaction (as it must for redeliveries anyway). A message that does not decode goes to the DLQ at
once, and so does one whose subject is not exactly the one its type and key build
(`ibpool_proto.misaddressed`: a body of another type on a subject its publisher may use, a key that
is not the subject's), before any handler sees it; a handler that keeps failing goes there after
`max_deliver` attempts.

Hand-off: a subscription with a `Handoff` may pass its batches to a transaction of its service's
own instead (the scheduler's cycle takes its job news, so a submission is stored and planned in one
transaction); what that transaction does not commit is handled the usual way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from opentelemetry import context as otel_context
from opentelemetry import trace

from ibpool_proto import Message

from . import faults, telemetry
from .bus import BAD_METADATA, Bus, Rejected, decode_delivered
from .logs import get_logger
from .metrics import ServiceMetrics
from .outages import OUTAGES
from .store import Store, Transaction
from .streams import stream_for_subject

log = get_logger(__name__)

_tracer = telemetry.tracer("ibpool.consumer")

# The same counts Prometheus scrapes, also as OTel metrics for an OTLP collector.
_handled = telemetry.meter("ibpool.consumer").create_counter(
    "ibpool.events.handled", description="events handled and acked"
)
_handler_duration = telemetry.meter("ibpool.consumer").create_histogram(
    "ibpool.handler.duration", unit="s", description="time in a handler"
)


class HandlerFailed(Exception):
    """A handler raised on the fast path; the batch is rolled back and re-run isolated."""


class Refused(Exception):
    """A handler's verdict that a message must never be acted on (a grant not signed by the pool
    allocator, one for GPUs already running other work): it is dead-lettered at once with the
    reason (`why` "refused"), not retried, and whatever its handler did is rolled back."""


class ConsumerConflict(Exception):
    """A durable consumer exists with settings the server will not change in place."""


class NoTransaction(Exception):
    """A handler tried to emit events from a consumer that has no store."""


@dataclass
class HandlerContext:
    """What a handler gets besides the event: its transaction, the delivery, who it is, and the
    message's bytes as they arrived (`data`: what a signature covers)."""

    tx: Transaction | None
    subject: str
    deliveries: int
    headers: Mapping[str, str]
    source: str
    data: bytes = b""

    async def emit(self, *messages: Message) -> None:
        """Queue events in the outbox of this handler's transaction."""
        if self.tx is None:
            raise NoTransaction("this consumer has no store; events must leave through an outbox")
        await self.tx.outbox(*messages)


Handler = Callable[[Any, HandlerContext], Awaitable[None]]
# Called once per batch on the fast path, in the batch transaction, before the handlers, with the
# batch's events that are not redeliveries: a service may read or write ahead for the whole batch
# in one statement (kept in `Transaction.scratch` for its handlers). It must leave the outcome as
# the handlers alone would have made it. If it raises, the batch is rolled back and run again one
# event at a time, without it.
Prepare = Callable[[list[Any], Transaction], Awaitable[None]]


class Handoff:
    """Batches a consumer passes to a transaction of its service's own instead of opening one.

    While `accepting()` is true, each fetched batch is decoded and kept here (unacked) and
    `arrived()` is called; the service then `take`s what is kept, runs `handle_in` inside its
    transaction and, once that committed, `settle`s (acks) what it took. If the transaction does not
    commit, or when the service will not take what is kept, `handle_apart` handles it in a
    transaction of its own, as if it had never been handed over. What is kept when the consumer
    stops is handled apart too. The consumer's `max_ack_pending` bounds what can be kept.
    """

    def __init__(self, accepting: Callable[[], bool], arrived: Callable[[], None]) -> None:
        self.accepting = accepting
        self.arrived = arrived
        self.kept: list[_Outcome] = []
        self.consumer: Consumer | None = None

    def take(self) -> list[_Outcome]:
        """Everything kept so far (the caller now owns it: it must settle it or hand it apart)."""
        taken, self.kept = self.kept, []
        return taken

    async def handle_in(self, tx: Transaction, taken: list[_Outcome]) -> None:
        """The handlers of `taken` in `tx`, its inbox rows included, with the batch's `prepare`.
        Raises `HandlerFailed` when one raises: `tx` must then be rolled back and `taken` handled apart."""
        assert self.consumer is not None
        await self.consumer._handle_in(tx, taken)

    async def settle(self, taken: list[_Outcome]) -> None:
        """Ack what `handle_in` handled, once its transaction committed."""
        assert self.consumer is not None
        await self.consumer._settle_all(taken)

    async def handle_apart(self, taken: list[_Outcome]) -> None:
        """Handle `taken` as the consumer does without a hand-off: its own transaction, then settled."""
        assert self.consumer is not None
        for o in taken:
            o.error, o.duplicate = None, False
        await self.consumer._handle_and_settle(taken)


@dataclass(frozen=True)
class Subscription:
    """A durable consumer: which subjects, which handler, whether it runs in a store transaction."""

    durable: str
    filter_subjects: tuple[str, ...]
    handler: Handler
    transactional: bool = True
    stream: str | None = None
    prepare: Prepare | None = None
    handoff: Handoff | None = None

    def stream_name(self) -> str:
        return self.stream or stream_for_subject(self.filter_subjects[0])


@dataclass
class ConsumerSettings:
    batch: int = 64
    max_ack_pending: int = 1024
    ack_wait_s: float = 30.0
    max_deliver: int = 5
    fetch_timeout_s: float = 0.5


@dataclass
class _Outcome:
    msg: Msg
    event: Message | None
    error: str | None = None
    duplicate: bool = False
    refused: bool = False


@dataclass
class Consumer:
    bus: Bus
    store: Store | None
    sub: Subscription
    settings: ConsumerSettings
    metrics: ServiceMetrics
    source: str
    busy: bool = False
    running: bool = False
    # The durable was found gone (deleted by someone): made again, ready again once it is.
    missing: bool = False
    # The last dead letter could not be published (the message was not acked: it comes again).
    dlq_failing: bool = False
    _psub: Any = field(default=None, repr=False)
    # The stream sequence below which the consumer had acked everything, when last asked (`pending`):
    # where a durable made again starts, so what it had not acked comes again and nothing is skipped.
    _ack_floor: int = 0

    def __post_init__(self) -> None:
        if self.sub.handoff is not None:
            self.sub.handoff.consumer = self

    async def start(self, from_seq: int | None = None) -> None:
        """Create the durable (or update it in place); `from_seq`: a new one starts at that stream
        sequence (a durable made again after it was deleted) instead of the stream's start."""
        stream = self.sub.stream_name()
        config = ConsumerConfig(
            durable_name=self.sub.durable,
            deliver_policy=DeliverPolicy.ALL if from_seq is None else DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=from_seq,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.settings.ack_wait_s,
            max_deliver=self.settings.max_deliver,
            max_ack_pending=self.settings.max_ack_pending,
            filter_subjects=list(self.sub.filter_subjects),
        )
        try:
            # Creates the durable, or updates it in place (filters, ack wait, limits) keeping its position.
            await self.bus.js.add_consumer(stream, config)
        except nats.js.errors.BadRequestError as e:
            # Never delete and recreate silently: that would replay the whole stream.
            raise ConsumerConflict(
                f"durable consumer {self.sub.durable!r} on {stream} exists with settings that cannot be "
                f"changed in place ({e.description}); remove it deliberately to start over"
            ) from None
        self._psub = await self.bus.js.pull_subscribe_bind(self.sub.durable, stream=stream)

    async def pending(self) -> int:
        info = await self.bus.js.consumer_info(self.sub.stream_name(), self.sub.durable)
        if info.ack_floor is not None and info.ack_floor.stream_seq:
            self._ack_floor = max(self._ack_floor, int(info.ack_floor.stream_seq))
        return int(info.num_pending or 0)

    async def recreate_if_gone(self) -> bool:
        """After a failed fetch: if the durable no longer exists (someone deleted it), make it again
        from the last known ack floor and say so loudly; True when it was gone."""
        try:
            await self.pending()
            self.missing = False
            return False
        except nats.js.errors.NotFoundError:
            pass
        self.missing = True
        log.error(
            "durable consumer is gone; making it again",
            consumer=self.sub.durable,
            stream=self.sub.stream_name(),
            from_seq=self._ack_floor + 1,
        )
        self.metrics.consumers_recreated.labels(self.sub.durable).inc()
        with contextlib.suppress(Exception):
            await self._psub.unsubscribe()
        await self.start(from_seq=self._ack_floor + 1)
        self.missing = False
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Fetch and handle until `stop` is set; the batch in hand is always finished."""
        self.running = True
        try:
            while not stop.is_set():
                try:
                    msgs = await self._psub.fetch(self.settings.batch, timeout=self.settings.fetch_timeout_s)
                except (nats.errors.TimeoutError, TimeoutError):
                    continue
                except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError):
                    break
                except OUTAGES as e:  # the bus away, or the durable gone (NotFoundError): see which
                    self.metrics.loop_failed(f"{self.sub.durable} fetch", e)
                    log.warning("fetch failed", consumer=self.sub.durable, error=str(e) or type(e).__name__)
                    try:
                        await self.recreate_if_gone()
                    except OUTAGES as again:  # the bus is away (not known to be gone), or it may not be made
                        self.metrics.loop_failed(f"{self.sub.durable} recreate", again)
                        if self.missing:
                            log.error(
                                "durable consumer not made again yet", consumer=self.sub.durable, error=str(again)
                            )
                    await asyncio.sleep(0.5)
                    continue
                self.missing = False
                self.busy = True
                try:
                    await self.process(msgs)
                finally:
                    self.busy = False
        finally:
            self.running = False
            if self.sub.handoff is not None and self.sub.handoff.kept:
                await self.sub.handoff.handle_apart(self.sub.handoff.take())
            with contextlib.suppress(Exception):
                await self._psub.unsubscribe()

    async def process(self, msgs: Sequence[Msg]) -> None:
        outcomes: list[_Outcome] = []
        for msg in msgs:
            message = decode_delivered(msg)
            if isinstance(message, Rejected):  # never handled
                await self._dead_letter(msg, f"{message.why}: {message.error}", why=message.why)
                continue
            outcomes.append(_Outcome(msg, message))
        if not outcomes:
            return
        handoff = self.sub.handoff
        if handoff is not None and handoff.accepting():
            handoff.kept.extend(outcomes)
            handoff.arrived()
            return
        await self._handle_and_settle(outcomes)

    async def _handle_and_settle(self, outcomes: list[_Outcome]) -> None:
        if self.sub.transactional and self.store is not None:
            try:
                await self._handle_batch(outcomes, self.store)
            except HandlerFailed:
                # Nothing of the batch was committed. Run it again one event at a time, each in its
                # own savepoint, so only the failing events are nak'd.
                for o in outcomes:
                    o.error, o.duplicate, o.refused = None, False, False
                await self._handle_batch_isolated(outcomes, self.store)
            except OUTAGES as e:  # the commit itself failed: nothing of the batch happened
                self._commit_failed(outcomes, e)
        else:
            for o in outcomes:
                await self._handle_one(o, None, isolated=False)
        await self._settle_all(outcomes)

    async def _settle_all(self, outcomes: list[_Outcome]) -> None:
        for o in outcomes:
            await self._settle(o)

    async def _handle_batch(self, outcomes: list[_Outcome], store: Store) -> None:
        """The fast path: one inbox insert for the batch, handlers in the batch transaction, one commit."""
        async with store.transaction() as tx:
            await self._handle_in(tx, outcomes)

    async def _handle_in(self, tx: Transaction, outcomes: list[_Outcome]) -> None:
        """The fast path's work inside `tx`: inbox rows, `prepare`, every handler; HandlerFailed on a failure."""
        fresh = set(await tx.mark_handled_many(self.sub.durable, [o.event.id for o in outcomes if o.event]))
        for o in outcomes:
            assert o.event is not None
            if o.event.id not in fresh:
                o.duplicate = True
                continue
            fresh.discard(o.event.id)  # a second copy in the same batch is a duplicate too
        if self.sub.prepare is not None:
            try:
                await self.sub.prepare([o.event for o in outcomes if not o.duplicate], tx)
            except Exception as e:
                # Any error: `prepare` is only a read-ahead, and the batch run again one event at a time
                # without it is right whatever it met (a bug in it is logged and counted every batch).
                self.metrics.loop_failed(f"{self.sub.durable} prepare", e)
                log.warning(
                    "batch prepare failed; the batch runs again one event at a time",
                    consumer=self.sub.durable,
                    error=f"{type(e).__name__}: {e}",
                )
                raise HandlerFailed(f"prepare: {type(e).__name__}: {e}") from e
        for o in outcomes:
            if o.duplicate:
                continue
            await self._handle_one(o, tx, isolated=False)
            if o.error is not None:
                raise HandlerFailed(o.error)

    async def _handle_batch_isolated(self, outcomes: list[_Outcome], store: Store) -> None:
        try:
            async with store.transaction() as tx:
                for o in outcomes:
                    await self._handle_one(o, tx, isolated=True)
        except OUTAGES as e:  # the commit failed (or the store went away between savepoints)
            self._commit_failed(outcomes, e)

    def _commit_failed(self, outcomes: list[_Outcome], e: Exception) -> None:
        """Nothing of the batch was committed: every event is nak'd (counted in `ibpool_events_failed`
        when settled), so the outage is not counted again here."""
        log.warning("batch commit failed", consumer=self.sub.durable, error=str(e))
        for o in outcomes:
            o.error = o.error or f"commit: {e}"
            o.duplicate = False

    async def _handle_one(self, o: _Outcome, tx: Transaction | None, *, isolated: bool) -> None:
        """Run the handler in a CONSUMER span whose parent is the producer's context.

        `isolated`: inside a savepoint that also writes the inbox row, so a failure undoes only this event.
        """
        assert o.event is not None
        headers = dict(o.msg.headers or {})
        deliveries = _deliveries(o.msg)
        token = otel_context.attach(telemetry.extract(headers))
        started = time.perf_counter()
        try:
            with _tracer.start_as_current_span(
                f"handle {o.event.ce_type()}",
                kind=trace.SpanKind.CONSUMER,
                attributes={
                    "messaging.system": "nats",
                    "messaging.destination.name": o.msg.subject,
                    "messaging.message.id": o.event.id,
                    "messaging.consumer.group.name": self.sub.durable,
                    "ibpool.deliveries": deliveries,
                },
            ) as span:
                ctx = HandlerContext(tx, o.msg.subject, deliveries, headers, self.source, o.msg.data)
                try:
                    if tx is not None and isolated:
                        async with tx.savepoint():
                            if not await tx.mark_handled(self.sub.durable, o.event.id):
                                o.duplicate = True
                                span.set_attribute("ibpool.duplicate", True)
                                return
                            await faults.delay_if_armed("handler.delay_s")
                            await self.sub.handler(o.event, ctx)
                    else:
                        await faults.delay_if_armed("handler.delay_s")
                        await self.sub.handler(o.event, ctx)
                except Exception as e:
                    # Any error: a handler that raises naks its message, which comes again and after
                    # `max_deliver` attempts goes to the DLQ with the reason; one event's bug must not
                    # stop the consumer. Counted in `ibpool_events_failed` (or dead-lettered, Refused).
                    o.error = f"{type(e).__name__}: {e}"
                    o.refused = isinstance(e, Refused)
                    span.record_exception(e)
                    span.set_status(trace.Status(trace.StatusCode.ERROR, o.error))
        finally:
            otel_context.detach(token)
            elapsed = time.perf_counter() - started
            self.metrics.handler_seconds.labels(self.sub.durable).observe(elapsed)
            _handler_duration.record(elapsed, {"consumer": self.sub.durable})

    async def _settle(self, o: _Outcome) -> None:
        assert o.event is not None
        kind = o.event.ce_type()
        if o.error is None:
            await o.msg.ack()
            if o.duplicate:
                self.metrics.duplicates.labels(self.sub.durable).inc()
            else:
                self.metrics.handled.labels(self.sub.durable, kind).inc()
                _handled.add(1, {"consumer": self.sub.durable, "type": kind})
            return
        if o.refused:
            await self._dead_letter(o.msg, f"refused: {o.error.removeprefix('Refused: ')}", why="refused")
            return
        self.metrics.failed.labels(self.sub.durable, kind).inc()
        deliveries = _deliveries(o.msg)
        if deliveries >= self.settings.max_deliver:
            await self._dead_letter(o.msg, f"handler failed {deliveries} times: {o.error}", why="handler")
            return
        log.warning(
            "handler failed, will retry",
            consumer=self.sub.durable,
            event_id=o.event.id,
            deliveries=deliveries,
            error=o.error,
        )
        await o.msg.nak(delay=min(0.25 * 2 ** (deliveries - 1), 30.0))

    async def _dead_letter(self, msg: Msg, reason: str, *, why: str) -> None:
        log.error("dead-lettering message", consumer=self.sub.durable, subject=msg.subject, reason=reason)
        try:
            await self.bus.dead_letter(msg, consumer=self.sub.durable, reason=reason, deliveries=_deliveries(msg))
        except OUTAGES as e:  # DLQ unreachable: not acked, so it comes again; loud, and not ready meanwhile
            self.dlq_failing = True
            self.metrics.dead_letter_failures.labels(self.sub.durable).inc()
            log.error("dead-letter publish failed; the message is kept", consumer=self.sub.durable, error=str(e))
            with contextlib.suppress(Exception):
                await msg.nak(delay=5.0)
            return
        self.dlq_failing = False
        self.metrics.dead_lettered.labels(self.sub.durable, why).inc()
        await msg.term()


def _deliveries(msg: Msg) -> int:
    try:
        return int(msg.metadata.num_delivered)
    except BAD_METADATA:  # not a JetStream message (never so from a pull consumer): its first delivery
        return 1
