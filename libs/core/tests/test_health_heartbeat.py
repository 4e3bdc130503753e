"""Heartbeat liveness: late after k intervals, lost after the fail window, never lost before late."""

import datetime as dt

import pytest

from ibpool_core.health.heartbeat import HeartbeatRules, clear_after_s, liveness

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
RULES = HeartbeatRules(suspect_after_intervals=2.5, fail_after_s=3.0, clear_after_beats=3)


@pytest.mark.parametrize(
    ("name", "gap_s", "interval_s", "rules", "want"),
    [
        ("on time", 0.9, 1.0, RULES, "alive"),
        ("jittered beat 1.9 intervals late", 1.9, 1.0, RULES, "alive"),
        ("at the suspect threshold exactly", 2.5, 1.0, RULES, "alive"),
        ("past the suspect threshold", 2.6, 1.0, RULES, "late"),
        ("at the fail window exactly", 3.0, 1.0, RULES, "late"),
        ("past the fail window", 3.1, 1.0, RULES, "lost"),
        ("long silence", 600.0, 1.0, RULES, "lost"),
        ("slow beats scale the late threshold", 20.0, 10.0, RULES, "alive"),
        ("slow beats: a short fail window does not make them lost early", 24.0, 10.0, RULES, "alive"),
        ("slow beats: past both windows", 26.0, 10.0, RULES, "lost"),
        ("a long fail window: late first", 40.0, 10.0, HeartbeatRules(fail_after_s=60.0), "late"),
    ],
)
def test_liveness(name: str, gap_s: float, interval_s: float, rules: HeartbeatRules, want: str) -> None:
    assert liveness(T0, interval_s, T0 + dt.timedelta(seconds=gap_s), rules) == want, name


def test_clear_window_counts_beat_intervals() -> None:
    assert clear_after_s(0.5, RULES) == 1.5
