"""Tuned on the first half, reported on the second: the split, the choice and the report's entries."""

from __future__ import annotations

import pytest

from ibpool_sim.cluster_sim import SimConfig, gittins_samples, simulate
from ibpool_sim.halves import CANDIDATES, report_entries, split, tune
from ibpool_sim.sched_lineup import LEARNED_GITTINS, LearnedThresholds, RunOptions, config_for, select
from ibpool_sim.traces import TraceJob


def jobs(n: int) -> list[TraceJob]:
    return [
        TraceJob(id=f"j{i}", tenant="t", gpus=1 + (i % 3) * 4, submit_s=100.0 * i + 7, duration_s=60.0 * (1 + i % 7))
        for i in range(n)
    ]


def test_split_cuts_in_time_order_and_rebases_each_half() -> None:
    trace = list(reversed(jobs(7)))
    first, second = split(trace)
    assert [t.id for t in first] == ["j0", "j1", "j2", "j3"]
    assert [t.id for t in second] == ["j4", "j5", "j6"]
    assert first[0].submit_s == 0.0 and second[0].submit_s == 0.0
    assert [t.submit_s for t in second] == [0.0, 100.0, 200.0]
    assert split([]) == ([], [])


def test_the_shipped_ladder_is_a_candidate_and_ladders_are_checked() -> None:
    assert CANDIDATES[0] == LEARNED_GITTINS
    assert LEARNED_GITTINS.seconds == [600.0, *(3600.0 * 2**k for k in range(9))]
    assert LearnedThresholds(first_s=600, start_s=3600, ratio=4).seconds == [600, 3600, 14400, 57600, 230400, 921600]
    with pytest.raises(ValueError, match="ratio > 1"):
        LearnedThresholds(first_s=600, start_s=3600, ratio=1.0)
    with pytest.raises(ValueError, match="first <= start"):
        LearnedThresholds(first_s=7200, start_s=3600)


def test_tune_chooses_the_lowest_first_half_jct_and_the_earlier_on_a_tie() -> None:
    seen: list[list[str]] = []

    def run(entries: list[object]) -> list[float]:
        seen.append([e.label for e in entries])  # type: ignore[attr-defined]
        return [5.0, 3.0, 3.0, 9.0, 4.0, 3.5][: len(entries)]

    chosen, trials = tune(CANDIDATES, jobs(4), run)
    assert chosen == CANDIDATES[1]
    assert [t.avg_jct_s for t in trials] == [5.0, 3.0, 3.0, 9.0, 4.0, 3.5]
    assert seen[0][0] == f"gittins-learned[{CANDIDATES[0].name}]"
    with pytest.raises(ValueError, match="no candidate"):
        tune([], jobs(4), run)


def test_report_entries_use_the_choice_and_first_half_samples_only() -> None:
    first, _ = split(jobs(40))
    chosen = CANDIDATES[5]
    out = {e.label: e for e in report_entries(select("fifo+easy,gittins,gittins-learned"), chosen, first)}
    assert out["gittins-learned"].params["thresholds"] == chosen.seconds
    assert out["gittins"].params["samples"] == gittins_samples(first)
    assert out["fifo+easy"].params == {}


def test_the_chosen_ladder_runs_in_the_simulator() -> None:
    _, second = split(jobs(60))
    entry = report_entries(select("gittins-learned"), CANDIDATES[5], second)[0]
    result = simulate(second, config_for(entry, RunOptions(nodes=4)))
    assert len(result.outcomes) == len(second)
    assert isinstance(config_for(entry, RunOptions(nodes=4)), SimConfig)
