"""A replica of the pool ledger: the allocator's events folded with `ibpool_core.pool.ledger.apply`.

The allocator publishes every change of its ledger as an event, and replaying them rebuilds it
(ledger.py). A service that decides on the pool (the scheduler; the autoscaler for batch
elasticity) reads them from the start of the pool stream with an ephemeral consumer (no acks,
nothing stored) and keeps the ledger in memory: which GPUs exist, which are free, failed or
cordoned, the ledger version a proposal is computed on, and the leases of its grants. A gap (an
event more than one version ahead: missed, or the stream lost its head to `max_age`) starts the
replay over; until the replica has read what the stream held when it started, it is not
`caught_up` and its owner does not decide on it.

The grants of one allocation need not arrive together: a gang that replaced a failed member has an
`AllocationRevoked` for that node and a later `AllocationGranted` (with `replaces`) for the new node
under the same allocation id; `apply` folds each per node, so the replica needs nothing of its own.
A replica answers no command, so it keeps no answers of the past (`past_kept=0`).

The stream keeps 30 days, so after a month its first event is not the ledger's first. The pool
allocator therefore publishes a snapshot of its ledger (`publish_snapshot`, every
`snapshot_interval_s`) to the JetStream object store `LEDGER_BUCKET`: a replica starts from the
newest snapshot and replays the stream from the sequence it names. Without one (a young cluster,
or an allocator that never ran with this code) it replays from the stream's first message.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib

import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, ObjectStoreConfig, StorageType

from ibpool_core.pool.ledger import (
    Ledger,
    LedgerGap,
    LedgerSnapshot,
    apply,
    decode_ledger,
    decode_snapshot,
    encode_snapshot,
)
from ibpool_core.pool.messages import LedgerEvent
from ibpool_proto.pool import (
    AllocationExpired,
    AllocationGranted,
    AllocationRejected,
    AllocationReleased,
    AllocationRevoked,
    LeaseRenewed,
    PoolNodeUpdated,
    QuotaChanged,
)

from .bus import Bus, Rejected, decode_delivered
from .logs import get_logger
from .metrics import ServiceMetrics, count_failure
from .outages import OUTAGES
from .service import sleep_unless_stopped
from .streams import stream_for_subject

log = get_logger(__name__)

LEDGER_EVENTS = (
    AllocationGranted,
    AllocationRejected,
    AllocationReleased,
    AllocationRevoked,
    AllocationExpired,
    LeaseRenewed,
    PoolNodeUpdated,
    QuotaChanged,
)
BATCH = 512
# What makes a replica replay the stream from its first event instead of starting at the snapshot:
# the snapshot damaged (ValueError: not a snapshot, another ledger format, chunks not matching the
# digest), refused (a NATS user without the bucket's permissions: a timeout), or the bus away.
SNAPSHOT_UNUSABLE: tuple[type[Exception], ...] = (ValueError, *OUTAGES)
INACTIVE_S = 10.0

# The pool allocator's snapshots of its ledger: one object, replaced by every new snapshot.
LEDGER_BUCKET = "ibpool_ledger"
SNAPSHOT_OBJECT = "snapshot"
# A read of 9 MB at 1,000 busy nodes, 107 MB at 12,500 (0.5 s on the embedded stack,
# tests/bench/bench_snapshot.py); one that meets a snapshot being replaced would wait for chunks that are gone.
SNAPSHOT_READ_TIMEOUT_S = 30.0


async def publish_snapshot(bus: Bus, snapshot: LedgerSnapshot, replicas: int = 1) -> int:
    """Replace the snapshot replicas start from (the bucket is made on first use); returns its size in bytes."""
    try:
        store = await bus.js.object_store(LEDGER_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        config = ObjectStoreConfig(
            description="The pool allocator's newest ledger snapshot: where ledger replicas start",
            storage=StorageType.FILE,
            replicas=replicas,
        )
        store = await bus.js.create_object_store(LEDGER_BUCKET, config)
    data = encode_snapshot(snapshot)
    await store.put(SNAPSHOT_OBJECT, data)
    return len(data)


async def read_snapshot(bus: Bus) -> LedgerSnapshot | None:
    """The newest snapshot; None when none was published. ValueError when it is damaged; a read
    that fails or times out raises."""
    data = await asyncio.wait_for(read_object(bus, LEDGER_BUCKET, SNAPSHOT_OBJECT), SNAPSHOT_READ_TIMEOUT_S)
    return None if data is None else decode_snapshot(data)


async def read_object(bus: Bus, bucket: str, name: str) -> bytes | None:
    """An object of a JetStream object store (None when the bucket or the object is not there),
    read chunk by chunk (answering the server's flow control at once) and checked against its
    digest. Its ordered consumer is unsubscribed however the read ends, a timeout's cancellation
    included (nats.py's `ObjectStore.get` leaves it subscribed then, and joins the chunks with
    `+=`). ValueError when the chunks do not match the digest."""
    try:
        info = await (await bus.js.object_store(bucket)).get_info(name)
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.ObjectNotFoundError):
        return None
    if not info.size:
        return b""
    if info.is_link() or not info.nuid or not info.digest:
        raise ValueError(f"object {name!r} of bucket {bucket!r} is a link or has no chunks to read")
    chunks: list[bytes] = []
    digest = hashlib.sha256()
    sub = await bus.js.subscribe(f"$O.{bucket}.C.{info.nuid}", ordered_consumer=True)
    try:
        while True:
            # `next_msg`, not `async for msg in sub.messages`: it answers the server's flow control as
            # soon as the chunks before it are read, while with the iterator nats.py's poller answers,
            # every 0.25 s, and the server sends nothing meanwhile: a 9 MB snapshot (1,000 busy nodes)
            # took 530 ms to read instead of 25, one of 107 MB (12,500 nodes) 2.2 s instead of 0.5.
            msg = await sub.next_msg(timeout=None)
            chunks.append(msg.data)
            digest.update(msg.data)
            if msg.metadata.num_pending == 0:
                break
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    if digest.digest() != base64.urlsafe_b64decode(info.digest.split("=", 1)[1]):
        raise ValueError(f"object {name!r} of bucket {bucket!r} does not match its digest")
    return b"".join(chunks)


class LedgerReplica:
    def __init__(self, bus: Bus, from_seq: int | None = None, *, metrics: ServiceMetrics | None = None) -> None:
        """`from_seq`: replay from this stream sequence instead of the first (tests sharing one
        stream between allocators with ledgers of their own). `metrics`: where the failures the
        replica survives are counted (`ibpool_loop_failures`, loops "pool ledger" and "pool ledger
        snapshot")."""
        self.bus = bus
        self.metrics = metrics
        self.from_seq = from_seq
        self.ledger = Ledger(past_kept=0)
        self.caught_up = False
        self.replays = 0
        self.from_snapshot = False  # whether the current replay began at a snapshot
        # Set whenever the ledger changed: capacity may have freed up.
        self.changed = asyncio.Event()

    def fold(self, events: list[LedgerEvent]) -> None:
        """Apply events in stream order; LedgerGap propagates (the caller replays from the start)."""
        apply(self.ledger, events)
        if events:
            self.changed.set()

    async def start_point(self, stream: str) -> tuple[Ledger, int | None]:
        """The ledger to replay onto and the stream sequence to replay from (None: the first):
        the newest snapshot's, unless `from_seq` is given or the snapshot cannot be used."""
        self.from_snapshot = False
        if self.from_seq is not None:
            return Ledger(past_kept=0), self.from_seq
        try:
            snapshot = await read_snapshot(self.bus)
            ledger = None if snapshot is None else decode_ledger(snapshot.ledger, past_kept=0)
        except SNAPSHOT_UNUSABLE as e:
            count_failure(self.metrics, "pool ledger snapshot", e)
            # The stream may still hold the ledger's first event; if not, the gap brings us back here.
            log.error(
                "the pool ledger snapshot cannot be read; replaying the stream from its first event",
                error=str(e) or type(e).__name__,
            )
            snapshot = ledger = None
        if snapshot is None or ledger is None:
            return Ledger(past_kept=0), None
        state = (await self.bus.js.stream_info(stream)).state
        after_last = state.last_seq + 1
        if snapshot.stream_seq > after_last:
            # The stream was made anew after the snapshot (its sequences began again): it cannot be placed.
            log.error(
                "the pool ledger snapshot is ahead of the pool stream; replaying the stream from its first event",
                snapshot_stream_seq=snapshot.stream_seq,
                stream_next_seq=after_last,
            )
            return Ledger(past_kept=0), None
        if snapshot.stream_seq < state.first_seq:
            log.warning(
                "the pool ledger snapshot is older than the pool stream's first message; events after it may be gone",
                snapshot_stream_seq=snapshot.stream_seq,
                stream_first_seq=state.first_seq,
            )
        log.info("pool ledger replica starts from a snapshot", version=ledger.version, stream_seq=snapshot.stream_seq)
        self.from_snapshot = True
        return ledger, snapshot.stream_seq

    async def run(self, stop: asyncio.Event) -> None:
        """Replay the pool stream (from the newest snapshot when there is one), then follow it, until `stop`."""
        patterns = [t.subject_pattern() for t in LEDGER_EVENTS]
        stream = stream_for_subject(patterns[0])
        while not stop.is_set():
            sub = None
            try:
                ledger, start_seq = await self.start_point(stream)
                sub = await self.bus.js.pull_subscribe(
                    patterns[0],
                    stream=stream,
                    config=ConsumerConfig(
                        deliver_policy=DeliverPolicy.ALL if start_seq is None else DeliverPolicy.BY_START_SEQUENCE,
                        opt_start_seq=start_seq,
                        ack_policy=AckPolicy.NONE,
                        filter_subjects=patterns,
                        inactive_threshold=INACTIVE_S,
                    ),
                )
                self.ledger, self.caught_up = ledger, False
                backlog = (await sub.consumer_info()).num_pending or 0
                read = 0
                if backlog == 0:
                    self.caught_up = True
                while not stop.is_set():
                    try:
                        msgs = await sub.fetch(BATCH, timeout=0.5)
                    except (nats.errors.TimeoutError, TimeoutError):
                        self.caught_up = True
                        continue
                    events: list[LedgerEvent] = []
                    for m in msgs:
                        message = decode_delivered(m)
                        if isinstance(message, Rejected):
                            log.warning("pool event skipped", subject=m.subject, why=message.why, error=message.error)
                            continue
                        if isinstance(message, LEDGER_EVENTS):
                            events.append(message)
                    self.fold(events)
                    read += len(msgs)
                    if read >= backlog and not self.caught_up:
                        self.caught_up = True
                        log.info("pool ledger replica caught up", version=self.ledger.version)
            except LedgerGap as e:
                self.replays += 1
                log.warning("pool ledger replica has a gap; replaying the stream", error=str(e))
                if self.from_snapshot:
                    log.error(
                        "the pool stream no longer holds the events after the newest ledger snapshot: the pool"
                        " allocator has not published one for longer than the stream keeps messages"
                    )
                elif self.ledger.version == 0 and self.from_seq is None:
                    log.error(
                        "the pool stream no longer holds the ledger's first events and no usable snapshot of the"
                        f" ledger is in the object store bucket {LEDGER_BUCKET}: the pool allocator publishes"
                        " one at start and every snapshot_interval_s"
                    )
                await sleep_unless_stopped(stop, 1.0)
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError):
                break
            except OUTAGES as e:  # the server dropped the consumer (reconnect, inactivity): start anew
                count_failure(self.metrics, "pool ledger", e)
                log.warning("following the pool ledger failed; replaying", error=str(e) or type(e).__name__)
                await sleep_unless_stopped(stop, 0.5)
            finally:
                if sub is not None:
                    with contextlib.suppress(Exception):
                        await sub.unsubscribe()
