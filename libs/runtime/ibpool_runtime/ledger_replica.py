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
"""

from __future__ import annotations

import asyncio
import contextlib

import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from ibpool_core.pool.ledger import Ledger, LedgerGap, apply
from ibpool_core.pool.messages import LedgerEvent
from ibpool_proto import DecodeError, decode
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

from .bus import Bus
from .logs import get_logger
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
INACTIVE_S = 10.0


class LedgerReplica:
    def __init__(self, bus: Bus, from_seq: int | None = None) -> None:
        """`from_seq`: replay from this stream sequence instead of the first (tests sharing one
        stream between allocators with ledgers of their own)."""
        self.bus = bus
        self.from_seq = from_seq
        self.ledger = Ledger(past_kept=0)
        self.caught_up = False
        self.replays = 0
        # Set whenever the ledger changed: capacity may have freed up.
        self.changed = asyncio.Event()

    def fold(self, events: list[LedgerEvent]) -> None:
        """Apply events in stream order; LedgerGap propagates (the caller replays from the start)."""
        apply(self.ledger, events)
        if events:
            self.changed.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Replay the pool stream, then follow it, until `stop`."""
        patterns = [t.subject_pattern() for t in LEDGER_EVENTS]
        stream = stream_for_subject(patterns[0])
        while not stop.is_set():
            sub = None
            try:
                sub = await self.bus.js.pull_subscribe(
                    patterns[0],
                    stream=stream,
                    config=ConsumerConfig(
                        deliver_policy=DeliverPolicy.ALL if self.from_seq is None else DeliverPolicy.BY_START_SEQUENCE,
                        opt_start_seq=self.from_seq,
                        ack_policy=AckPolicy.NONE,
                        filter_subjects=patterns,
                        inactive_threshold=INACTIVE_S,
                    ),
                )
                self.ledger, self.caught_up = Ledger(past_kept=0), False
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
                        try:
                            message = decode(m.data)
                        except DecodeError as e:
                            log.warning("undecodable pool event skipped", subject=m.subject, error=str(e))
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
                await sleep_unless_stopped(stop, 1.0)
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError):
                break
            except Exception as e:  # the server dropped the consumer (reconnect, inactivity): start anew
                log.warning("following the pool ledger failed; replaying", error=str(e) or type(e).__name__)
                await sleep_unless_stopped(stop, 0.5)
            finally:
                if sub is not None:
                    with contextlib.suppress(Exception):
                        await sub.unsubscribe()
