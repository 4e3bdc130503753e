"""The alert rules (deploy/prometheus/alerts.yml) load in Prometheus, fire on the faults they name and stay
silent on healthy series (promtool's own rule unit tests, deploy/prometheus/alerts_test.yml), tell an
operator what happened, and ask only for series the services export."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.exported_metrics import ROOT, series_labels, unknown_names_and_labels
from tests.integration.helpers import promtool

PROM = ROOT / "deploy/prometheus"
RULES = yaml.safe_load((PROM / "alerts.yml").read_text())
ALERTS = [r for g in RULES["groups"] for r in g["rules"] if "alert" in r]
UNIT_TESTS = yaml.safe_load((PROM / "alerts_test.yml").read_text())
# What the brief of the deployment asks an alert for, by the series it watches.
WATCHED = {
    "IbpoolServiceDown": "up",
    "IbpoolNodeFailed": "ibpool_failover_nodes",
    "IbpoolClusterDegraded": "ibpool_failover_cluster_degraded",
    "IbpoolXidStorm": "DCGM_FI_DEV_XID_ERRORS",
    "IbpoolLinkFlapping": "ibpool_fabric_links",
    "IbpoolDeadLettersGrowing": "ibpool_events_dead_lettered_total",
    "IbpoolOutboxLag": "ibpool_outbox_lag",
    "IbpoolQueueStarving": "ibpool_scheduler_oldest_wait_seconds",
}


def _promtool() -> str:
    tool = promtool()
    if tool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package)")
    return tool


def _run(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=120)


def test_prometheus_loads_the_config_and_its_rules() -> None:
    tool = _promtool()
    r = _run(tool, "check", "config", "prometheus.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 rule files found" in r.stdout and f"SUCCESS: {len(ALERTS)} rules found" in r.stdout


def test_every_alert_fires_on_its_fault_and_not_on_healthy_series() -> None:
    r = _run(_promtool(), "test", "rules", "alerts_test.yml")
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    cases = [c for t in UNIT_TESTS["tests"] for c in t.get("alert_rule_test", [])]
    for alert in ALERTS:
        mine = [c for c in cases if c["alertname"] == alert["alert"]]
        assert any(c.get("exp_alerts") for c in mine), f"{alert['alert']}: no test where it fires"
        assert any(not c.get("exp_alerts") for c in mine), f"{alert['alert']}: no test where it stays silent"


def test_a_wrong_expectation_fails_the_unit_tests(tmp_path: Path) -> None:
    """promtool's verdict is not vacuous: the same tests with one alert's threshold moved fail."""
    tool = _promtool()
    rules = (PROM / "alerts.yml").read_text()
    moved = rules.replace(
        "(ibpool_scheduler_oldest_wait_seconds) > 3600", "(ibpool_scheduler_oldest_wait_seconds) > 36000"
    )
    assert moved != rules
    (tmp_path / "alerts.yml").write_text(moved)
    shutil.copy(PROM / "alerts_test.yml", tmp_path)
    r = _run(tool, "test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert r.returncode != 0 and "IbpoolQueueStarving" in r.stdout + r.stderr


def test_every_alert_says_how_bad_and_what_happened() -> None:
    assert {a["alert"] for a in ALERTS} >= WATCHED.keys()
    for alert in ALERTS:
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), alert["alert"]
        assert alert["annotations"]["summary"] and alert["annotations"]["description"], alert["alert"]
    for name, series in WATCHED.items():
        (expr,) = [a["expr"] for a in ALERTS if a["alert"] == name]
        assert re.search(rf"\b{series}\b", expr), (name, expr)


def test_every_alert_is_in_the_operators_guide() -> None:
    guide = (ROOT / "docs/monitoring.md").read_text()
    missing = [a["alert"] for a in ALERTS if f"`{a['alert']}`" not in guide]
    assert not missing, missing


def test_every_series_and_label_an_alert_uses_is_exported_by_the_code() -> None:
    series = series_labels()
    problems = [f"{a['alert']}: {p}" for a in ALERTS for p in unknown_names_and_labels(a["expr"], series)]
    assert not problems, "\n".join(problems)


def test_every_scrape_job_labels_its_cluster() -> None:
    """The dashboards' Cluster variable and the alerts group by `cluster`: every job must set it."""
    prom = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert prom["rule_files"] == ["alerts.yml"]
    for job in prom["scrape_configs"]:
        static = [c.get("labels", {}).get("cluster") for c in job.get("static_configs", [])]
        relabelled = [r for r in job.get("relabel_configs", []) if r.get("target_label") == "cluster"]
        assert (static and all(static)) or relabelled, job["job_name"]
