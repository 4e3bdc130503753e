"""Telemetry that outlives a bus outage: kept in order, bounded, the oldest dropped first.

Samples are offered here instead of being published directly; `flush()` sends what is pending
while the bus is connected and stops at the first failure, keeping the rest for the next flush.
Give it an acknowledged publish: right after a reconnect JetStream may not be storing yet, and
an unacknowledged publish would be lost without a word (the message id makes a retry harmless).
Not for heartbeats (a late heartbeat says nothing about now) and not for events that must never
be lost: those go through the outbox.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable

from ibpool_proto import Message

from .logs import get_logger
from .metrics import ServiceMetrics, count_failure
from .outages import OUTAGES

log = get_logger(__name__)


class TelemetryBuffer:
    def __init__(
        self,
        publish: Callable[[Message], Awaitable[object]],
        connected: Callable[[], bool],
        capacity: int = 10_000,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        """`metrics`: where a flush that met an outage is counted (`ibpool_loop_failures{loop="telemetry flush"}`)."""
        if capacity < 1:
            raise ValueError(f"telemetry buffer capacity must be at least 1, got {capacity}")
        self.publish = publish
        self.metrics = metrics
        self.connected = connected
        self.capacity = capacity
        self.pending: deque[Message] = deque()
        self.dropped = 0
        self.sent = 0

    def offer(self, message: Message) -> None:
        """Queue a sample; when full, the oldest one makes room."""
        if len(self.pending) >= self.capacity:
            self.pending.popleft()
            self.dropped += 1
        self.pending.append(message)

    async def flush(self) -> int:
        """Publish pending samples in order while connected; how many went out."""
        sent = 0
        while self.pending and self.connected():
            try:
                await self.publish(self.pending[0])
            except OUTAGES as e:  # the bus went away mid-flush: keep the sample for next time
                count_failure(self.metrics, "telemetry flush", e)
                log.warning("telemetry held back", pending=len(self.pending), error=str(e) or type(e).__name__)
                break
            self.pending.popleft()
            sent += 1
        self.sent += sent
        return sent
