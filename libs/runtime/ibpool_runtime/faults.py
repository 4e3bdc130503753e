"""Named failure points for crash and shutdown tests, armed only by `IBPOOL_FAULTS`.

`IBPOOL_FAULTS="outbox.before_publish"` kills the process with SIGKILL right after the outbox
rows are read and before they are published; `handler.delay_s=2` holds every handler for two
seconds. Unset (always, in production), every point is a no-op.
"""

from __future__ import annotations

import asyncio
import os
import signal

# The last `IBPOOL_FAULTS` parsed and its points: a handler asks for every message it handles.
_parsed: tuple[str, dict[str, str]] = ("", {})


def _armed() -> dict[str, str]:
    global _parsed
    spec = os.environ.get("IBPOOL_FAULTS", "")
    if spec == _parsed[0]:
        return _parsed[1]
    points: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, value = item.partition("=")
        points[name] = value
    _parsed = (spec, points)
    return points


def crash_if_armed(point: str) -> None:
    if point in _armed():
        os.kill(os.getpid(), signal.SIGKILL)


async def delay_if_armed(point: str) -> None:
    value = _armed().get(point)
    if value:
        await asyncio.sleep(float(value))
