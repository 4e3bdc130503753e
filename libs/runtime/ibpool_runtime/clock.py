"""The wall clock, for services; the core only ever sees the `Clock` protocol."""

from __future__ import annotations

import datetime as dt


class SystemClock:
    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)
