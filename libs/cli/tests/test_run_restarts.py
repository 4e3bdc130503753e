"""`ibpool run --serve`'s restarts: when a service that died is started again."""

from __future__ import annotations

from ibpool_cli.run import Restarts


def test_a_crash_loop_backs_off_doubling_up_to_the_limit_and_a_long_run_starts_over() -> None:
    r = Restarts(first_s=1.0, max_s=8.0, reset_after_s=60.0)
    r.started("scheduler", 0.0)
    t = 0.0
    waits = []
    for _ in range(6):  # dies at once after each start
        at = r.died("scheduler", t)
        assert r.died("scheduler", t + 0.1) == at  # the same death, noticed again: the same start
        assert r.due(at - 0.01) == []
        waits.append(at - t)
        t = at
        assert r.due(t) == ["scheduler"]
        r.started("scheduler", t)
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert r.count == {"scheduler": 6} and r.text() == "scheduler 6x"
    # Ran longer than reset_after_s before dying: back to the first wait.
    assert r.died("scheduler", t + 61.0) == t + 62.0
    assert r.waiting() == {"scheduler": t + 62.0}


def test_services_are_restarted_apart_and_in_name_order() -> None:
    r = Restarts(first_s=1.0)
    for name in ("scheduler", "autoscaler"):
        r.started(name, 0.0)
        r.died(name, 10.0)
    assert r.due(11.0) == ["autoscaler", "scheduler"]
    r.started("autoscaler", 11.0)
    assert r.waiting() == {"scheduler": 11.0}
