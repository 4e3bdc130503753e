"""Traces as the cluster simulator replays them: Philly in submit order, and the generic CSV."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ibpool_sim.shared_data import need
from ibpool_sim.traces import TraceError, load_generic_jobs, philly_trace_jobs


def test_philly_jobs_are_in_submit_order_from_zero() -> None:
    jobs = philly_trace_jobs(need("traces/philly/philly.csv"))
    assert len(jobs) == 82_247
    assert jobs[0].submit_s == 0.0
    assert all(a.submit_s <= b.submit_s for a, b in itertools.pairwise(jobs))
    assert max(j.gpus for j in jobs) == 128
    assert len(philly_trace_jobs(need("traces/philly/philly.csv"), limit=10)) == 10


def test_generic_csv_with_optional_columns(tmp_path: Path) -> None:
    f = tmp_path / "jobs.csv"
    f.write_text(
        "submit_s,duration_s,num_gpus,tenant,priority,time_limit_s,name\n1000,60,8,a,1,120,train\n900,5,1,b,,,\n"
    )
    jobs = load_generic_jobs(f)
    assert [(j.tenant, j.submit_s, j.priority, j.time_limit_s, j.name) for j in jobs] == [
        ("b", 0.0, 0, None, None),
        ("a", 100.0, 1, 120.0, "train"),
    ]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("submit_s,duration_s,num_gpus\n1,2,3\n", "header"),
        ("submit_s,duration_s,num_gpus,tenant\n1,2,0,a\n", r"jobs.csv:2: ValueError: num_gpus must be >= 1"),
        ("submit_s,duration_s,num_gpus,tenant\n1,two,1,a\n", r"jobs.csv:2: ValueError"),
    ],
)
def test_generic_csv_errors_name_file_and_line(tmp_path: Path, text: str, match: str) -> None:
    f = tmp_path / "jobs.csv"
    f.write_text(text)
    with pytest.raises(TraceError, match=match):
        load_generic_jobs(f)
