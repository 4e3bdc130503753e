"""Time as the core sees it: passed in, never read from the wall."""

from __future__ import annotations

import datetime as dt
from typing import Protocol


class Clock(Protocol):
    def now(self) -> dt.datetime:
        """The current UTC time."""
        ...


class FixedClock:
    """A clock that only moves when told to; for tests and the simulator."""

    def __init__(self, start: dt.datetime) -> None:
        self._now = start

    def now(self) -> dt.datetime:
        return self._now

    def advance(self, seconds: float) -> dt.datetime:
        self._now += dt.timedelta(seconds=seconds)
        return self._now
