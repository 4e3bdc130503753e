"""Heartbeats: a node is late after `suspect_after_intervals` missed beats and lost after `fail_after_s`.

Pure. The clock is passed in. Hysteresis lives in the decision (`decide`): a late node becomes
suspected at once, but a suspected node is cleared only after `clear_after_beats` beat intervals on
time, so a jittery network that delays one beat past the window does not flip the verdict back and
forth on every beat.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

import msgspec

Liveness = Literal["alive", "late", "lost"]


class HeartbeatRules(msgspec.Struct, frozen=True, kw_only=True):
    # Late (suspected) once this many beat intervals passed without a beat.
    suspect_after_intervals: float = 2.5
    # Lost (failed) once this long passed without a beat; never before the node is late.
    fail_after_s: float = 3.0
    # A suspected or recovering node must beat on time for this many intervals before it is cleared.
    clear_after_beats: int = 3
    # A node whose agent's last bus connection closed (nats-server's advisory) is lost unless the
    # agent connects again, or is heard from, within this long.
    reconnect_grace_s: float = 1.0


def liveness(last_beat: dt.datetime, interval_s: float, now: dt.datetime, rules: HeartbeatRules) -> Liveness:
    """alive, late or lost, from the gap between the last beat and `now`.

    The lost threshold is at least the late one, so a node is never lost without having been late
    (a misconfigured `fail_after_s` cannot skip the suspicion).
    """
    gap = (now - last_beat).total_seconds()
    late_after = rules.suspect_after_intervals * interval_s
    if gap > max(rules.fail_after_s, late_after):
        return "lost"
    if gap > late_after:
        return "late"
    return "alive"


def clear_after_s(interval_s: float, rules: HeartbeatRules) -> float:
    """How long a suspected node must stay alive before the suspicion is lifted."""
    return rules.clear_after_beats * interval_s
