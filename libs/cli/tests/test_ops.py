"""The operator verbs' pure parts: which instance answers, the job body from flags and files, tables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ibpool_cli.ops import OpsError, choose, job_body, parser, table
from ibpool_runtime.discovery import ServiceView


def view(service: str, instance: str, role: str, url: str) -> ServiceView:
    return ServiceView(
        service=service, instance=instance, id=instance, version="0", role=role, http_url=url, started="", requests=0
    )


def test_the_leader_answers_for_a_service_then_one_that_does_not_elect() -> None:
    found = [
        view("scheduler", "a", "standby", "http://a"),
        view("scheduler", "b", "leader", "http://b"),
        view("pool_allocator", "x", "active", "http://x"),
        view("fabric_monitor", "f", "active", ""),  # no HTTP API: not usable
    ]
    assert choose(found) == {"scheduler": "http://b", "pool_allocator": "http://x"}


def test_a_job_body_from_a_file_and_flags_the_flags_winning(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("tenant: ml\nhosts: 2\ngpus_per_host: 8\nqueue: batch\n")
    args = parser("submit").parse_args(["-f", str(f), "--queue", "urgent", "--topology", "required", "--runtime", "60"])
    assert job_body(args) == {
        "tenant": "ml",
        "hosts": 2,
        "gpus_per_host": 8,
        "queue": "urgent",
        "topology": {"constraint": "required", "level": 1},
        "workload": {"simulated_runtime_s": 60.0},
    }
    f.write_text("- not a mapping\n")
    with pytest.raises(OpsError, match="a job file is one mapping") as e:
        job_body(parser("submit").parse_args(["-f", str(f)]))
    assert e.value.code == 2
    with pytest.raises(OpsError, match="needs a tenant"):
        job_body(parser("submit").parse_args(["--gpus", "1"]))


def test_a_table_pads_each_column_to_its_widest_cell() -> None:
    assert table(("A", "BB"), [("xxx", "y"), ("z", "")]) == "A    BB\nxxx  y\nz"


def test_bash_completes_commands_verbs_options_and_choices() -> None:
    """The completion script run by bash itself: what it offers after `ibpool jo`, `ibpool quota s`
    and `ibpool submit --to`."""
    script = subprocess.run([sys.executable, "-m", "ibpool_cli", "completion", "bash"], capture_output=True, text=True)
    assert script.returncode == 0, script.stderr
    probe = (
        script.stdout
        + "for line in 'ibpool jo' 'ibpool quota s' 'ibpool submit --to' 'ibpool ev'; do\n"
        + '  read -ra COMP_WORDS <<< "$line"; COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _ibpool; echo "${COMPREPLY[*]}"\n'
        + "done\n"
    )
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["job jobs", "set", "--token --topology --topology-level", "events"]


def test_usage_windows_are_iso_times_or_times_ago() -> None:
    import datetime as dt

    from ibpool_cli.ops import when

    now = dt.datetime(2026, 12, 5, 12, tzinfo=dt.UTC)
    assert when("24h", now) == "2026-12-04T12:00:00+00:00"
    assert when("1.5d", now) == "2026-12-04T00:00:00+00:00"
    assert when("2026-12-01T00:00:00", now) == "2026-12-01T00:00:00+00:00"  # no zone: UTC
    assert when("2026-12-01T00:00:00+02:00", now) == "2026-12-01T00:00:00+02:00"
    with pytest.raises(OpsError, match="neither an ISO 8601 time nor a time ago") as e:
        when("yesterday", now)
    assert e.value.code == 2


def test_cordon_uncordon_and_resume_take_a_gpu_drain_takes_the_node() -> None:
    args = parser("cordon").parse_args(["n1", "--gpu", "3", "--reason", "fan"])
    assert (args.node, args.gpu, args.reason) == ("n1", 3, "fan")
    assert parser("resume").parse_args(["n1", "--reason", "ok"]).gpu is None
    with pytest.raises(SystemExit):
        parser("drain").parse_args(["n1", "--gpu", "1", "--reason", "x"])


def test_the_config_file_fills_what_flags_and_the_environment_leave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ibpool_cli.ops import main

    conf = tmp_path / "config.yaml"
    conf.write_text("nats_url: nats://ops@10.0.0.5:4222\ntoken: t0k\nstate_dir: /srv/ibpool\n")
    monkeypatch.setenv("IBPOOL_CONFIG", str(conf))
    monkeypatch.delenv("IBPOOL_NATS_URL", raising=False)
    monkeypatch.delenv("IBPOOL_API_TOKEN", raising=False)
    args = parser("nodes").parse_args([])
    assert (args.nats_url, args.token, args.state_dir) == ("nats://ops@10.0.0.5:4222", "t0k", "/srv/ibpool")
    monkeypatch.setenv("IBPOOL_API_TOKEN", "from-env")
    assert parser("nodes").parse_args(["--nats-url", "nats://flag:4222"]).token == "from-env"
    assert parser("nodes").parse_args(["--nats-url", "nats://flag:4222"]).nats_url == "nats://flag:4222"
    conf.write_text("nats_url: x\npassword: y\n")
    with pytest.raises(OpsError, match="unknown key 'password'") as e:
        parser("nodes")
    assert e.value.code == 2 and str(conf) in str(e.value)
    assert main("nodes", []) == 2  # said on stderr, with the file's path


def test_wide_tables_add_columns_json_and_yaml_keep_the_data(capsys: pytest.CaptureFixture[str]) -> None:
    from ibpool_cli.ops import emit

    rows = [{"a": 1}]
    emit(rows, "wide", lambda r: "narrow", lambda r: "wide table")
    emit(rows, "table", lambda r: "narrow", lambda r: "wide table")
    emit(rows, "wide", lambda r: "only one")  # a verb without a wide table: its table
    assert capsys.readouterr().out.splitlines() == ["wide table", "narrow", "only one"]
