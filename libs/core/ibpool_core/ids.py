"""Ids of the events the pure core decides: derived from what caused them, never drawn at random.

A decision made twice on the same input gives the same events, ids included, so JetStream's
duplicate window drops a recomputed one (`Nats-Msg-Id` is the event id) and a test can compare
decisions byte for byte.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid


def event_id(now: dt.datetime, cause: str, n: int) -> str:
    """A UUIDv7 with `now` as its time and the rest taken from (cause, n): the same input, the same ids."""
    ms = int(now.timestamp() * 1000) & ((1 << 48) - 1)
    h = hashlib.sha256(f"{cause}/{n}".encode()).digest()
    rand_a = int.from_bytes(h[:2]) & 0xFFF
    rand_b = int.from_bytes(h[2:10]) & ((1 << 62) - 1)
    return str(uuid.UUID(int=(ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b))


class EventIds:
    """The ids of one decision's events, numbered in the order they are made: the n-th (from 0) is
    `event_id(now, cause, n)`, whatever cause each names, so two events of one decision never share an id."""

    def __init__(self, now: dt.datetime) -> None:
        self.now = now
        self.n = 0

    def next(self, cause: str) -> str:
        """The id of the decision's next event, caused by `cause`."""
        n, self.n = self.n, self.n + 1
        return event_id(self.now, cause, n)
