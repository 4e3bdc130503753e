"""The telemetry buffer: in order, bounded with the oldest dropped first, nothing lost on a failed flush."""

from __future__ import annotations

import asyncio

import pytest

from ibpool_proto import Message
from ibpool_proto.node import NodeHeartbeat
from ibpool_runtime.telemetry_buffer import TelemetryBuffer


def sample(seq: int) -> NodeHeartbeat:
    return NodeHeartbeat(source="t", key="n1", node_id="n1", seq=seq, interval_s=1.0)


class Wire:
    def __init__(self) -> None:
        self.up = False
        self.sent: list[int] = []
        self.fail_after: int | None = None

    async def publish(self, m: Message) -> None:
        if self.fail_after is not None and len(self.sent) >= self.fail_after:
            raise ConnectionError("connection lost")
        assert isinstance(m, NodeHeartbeat)
        self.sent.append(m.seq)


def test_outage_keeps_the_newest_samples_in_order() -> None:
    wire = Wire()
    buf = TelemetryBuffer(wire.publish, lambda: wire.up, capacity=3)
    for i in range(5):
        buf.offer(sample(i))
    assert asyncio.run(buf.flush()) == 0 and wire.sent == []
    wire.up = True
    assert asyncio.run(buf.flush()) == 3
    assert wire.sent == [2, 3, 4] and buf.dropped == 2 and not buf.pending


def test_a_failed_publish_keeps_that_sample_and_the_rest() -> None:
    wire = Wire()
    wire.up, wire.fail_after = True, 1
    buf = TelemetryBuffer(wire.publish, lambda: wire.up)
    for i in range(3):
        buf.offer(sample(i))
    assert asyncio.run(buf.flush()) == 1
    wire.fail_after = None
    assert asyncio.run(buf.flush()) == 2 and wire.sent == [0, 1, 2]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        TelemetryBuffer(Wire().publish, lambda: True, capacity=0)
