"""`ibpool sim` end to end on a slice of Philly and on a generic CSV."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ibpool_cli.sim import main
from ibpool_sim.shared_data import need


def test_sim_prints_every_policy_and_the_floors_as_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    need("traces/philly/philly.csv")
    plot = tmp_path / "cdf.png"
    code = main(["--trace", "philly", "--nodes", "16", "--limit", "400", "--format", "json", "--plot", str(plot)])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["jobs"] == 400
    labels = [p["policy"] for p in out["policies"]]
    assert labels[:3] == ["fifo", "fifo+easy-exact", "fifo+easy"] and "oracle-srtf" in labels and "dynamic" in labels
    assert all(p["jobs"] == 400 for p in out["policies"])
    assert {f["name"].split(" ", 1)[1] for f in out["floors"]} >= {"avg JCT / oracle-sjf", "avg JCT / fifo+easy"}
    assert plot.stat().st_size > 10_000


def test_sim_table_on_a_generic_csv(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("submit_s,duration_s,num_gpus,tenant\n0,100,8,a\n5,50,1,b\n7,10,16,a\n")
    assert main(["--trace", str(trace), "--nodes", "2", "--policy", "fifo,las"]) == 0
    out = capsys.readouterr().out
    assert "| fifo |" in out and "| las |" in out


def test_sim_with_the_service_placement_profile_and_sharp_leaves(capsys: pytest.CaptureFixture[str]) -> None:
    need("traces/philly/philly.csv")
    argv = ["--trace", "philly", "--nodes", "16", "--limit", "300", "--policy", "fifo+easy,las", "--format", "json"]
    assert main([*argv, "--placement", "framework", "--sharp-leaves", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["placement"] == "framework" and out["sharp_leaves"] == 1.0
    # The slice has multi-node jobs; under SHARP-capable leaves every one of them got SHARP.
    assert [p["sharp_share"] for p in out["policies"]] == [1.0, 1.0]


def test_sim_usage_and_input_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--policy", "nope"]) == 1
    assert main(["--sharp-leaves", "0.5"]) == 1  # SHARP goes with the framework placement
    assert main(["--placement", "framework", "--sharp-leaves", "2"]) == 1
    bad = tmp_path / "bad.csv"
    bad.write_text("when,what\n1,2\n")
    assert main(["--trace", str(bad)]) == 2
    assert "header" in capsys.readouterr().err


def test_sim_two_sites_compares_the_routings(capsys: pytest.CaptureFixture[str]) -> None:
    need("traces/philly/philly.csv")
    argv = ["--trace", "philly", "--nodes", "32", "--limit", "400", "--two-sites", "--format", "json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    by = {r["strategy"]: r for r in out["strategies"]}
    assert set(by) == {"first", "most-free", "choose"}
    assert by["first"]["placed"] == {"a": 400, "b": 0}
    assert all(sum(r["placed"].values()) == 400 for r in by.values())


def test_sim_halves_tunes_on_the_first_half_and_reports_the_second(capsys: pytest.CaptureFixture[str]) -> None:
    need("traces/philly/philly.csv")
    argv = ["--trace", "philly", "--nodes", "8", "--limit", "301", "--policy", "fifo+easy,gittins-learned"]
    assert main([*argv, "--halves", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["halves"] is True and out["jobs"] == 150  # the second half; the first holds the odd job
    tried = out["tuned_on_first_half"]
    assert len(tried) >= 2 and all(t["avg_jct_s"] > 0 for t in tried)
    assert [p["jobs"] for p in out["policies"]] == [150, 150]
    assert main([*argv, "--halves"]) == 0
    table = capsys.readouterr().out
    assert table.count("<- chosen") == 1 and "the second half of philly: 150 jobs" in table
