"""The Grafana dashboards (deploy/grafana/dashboards) are what Grafana reads and ask only for what the
services export.

- Each validates against Grafana's dashboard JSON schema: made from Grafana's own dashboard types (npm
  @grafana/schema) by deploy/grafana/dashboard-schema.sh, pinned by version and checksum, fetched from the
  npm registry into a cache outside git (it needs node and npm: missing, the test fails under CI and skips
  elsewhere; IBPOOL_REQUIRE_NODE=1 makes it fail anywhere).
- Every series and label a panel or a variable uses is one that some service's code exports
  (tests/deploy/exported_metrics.py reads the prometheus_client calls).
- Every expression parses: each is wrapped as a recording rule, with Grafana's variables filled in, and
  given to `promtool check rules`.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml
from jsonschema.exceptions import best_match

from tests.deploy.exported_metrics import ROOT, TARGET_LABELS, series_labels, unknown_names_and_labels
from tests.integration.helpers import promtool

DASHBOARDS = sorted((ROOT / "deploy/grafana/dashboards").glob("*.json"))
SCHEMA_SCRIPT = ROOT / "deploy/grafana/dashboard-schema.sh"
SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "pyproject.toml").exists())
# The services whose own metrics have a dashboard of their own; the others' runtime metrics are on
# ibpool-runtime (the web dashboard serves pages and exports only what every service does).
RUNTIME_ONLY = {"dashboard"}
# Dashboards not of one service
SHARED = {"ibpool-overview", "ibpool-runtime", "ibpool-gpus", "ibpool-fabric"}
LABEL_VALUES = re.compile(r"^label_values\((?:(.*),\s*)?([A-Za-z_]\w*)\)$")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _panels(dash: dict) -> list[dict]:
    out = []
    for p in dash.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))  # a row's collapsed panels
    return out


def _exprs(dash: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and of every query variable (label_values' selector)."""
    found = [
        (f"panel {p.get('id')} {p.get('title')!r} target {t.get('refId')}", t["expr"])
        for p in _panels(dash)
        for t in p.get("targets", [])
        if "expr" in t
    ]
    for v in dash.get("templating", {}).get("list", []):
        if v["type"] != "query":
            continue
        match = LABEL_VALUES.match(v["query"])
        assert match is not None, f"variable {v['name']}: not a label_values(...) query: {v['query']}"
        found.append((f"variable {v['name']}", match.group(1) or "up"))
    return found


def _fill_grafana_variables(expr: str) -> str:
    """What Grafana sends Prometheus: its interval variables as durations, template variables as values."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", "x", expr)


@pytest.fixture(scope="module")
def dashboard_schema() -> dict:
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        message = f"{', '.join(missing)} not installed: Grafana's dashboard schema is made with npm packages"
        if os.environ.get("CI") or os.environ.get("IBPOOL_REQUIRE_NODE") == "1":
            pytest.fail(message)
        pytest.skip(message)
    r = subprocess.run([str(SCHEMA_SCRIPT)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{SCHEMA_SCRIPT.name} failed:\n{r.stderr}"
    schema = json.loads(Path(r.stdout.strip().splitlines()[-1]).read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return schema


def _schema_errors(schema: dict, dash: dict) -> list[str]:
    errors = []
    for e in jsonschema.Draft7Validator(schema).iter_errors(dash):
        deepest = best_match(e.context) if e.context else e  # a panel is Panel or RowPanel: say why not Panel
        errors.append(f"/{'/'.join(map(str, deepest.absolute_path))}: {deepest.message[:300]}")
    return errors


def test_there_is_a_dashboard_for_every_service_with_metrics_of_its_own() -> None:
    names = {p.stem for p in DASHBOARDS}
    wanted = {f"ibpool-{s.replace('_', '-')}" for s in SERVICES if s not in RUNTIME_ONLY} | SHARED
    assert wanted <= names, wanted - names


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_validates_against_grafanas_dashboard_schema(path: Path, dashboard_schema: dict) -> None:
    errors = _schema_errors(dashboard_schema, _load(path))
    assert not errors, "\n".join(errors)


def test_the_schema_refuses_what_grafana_would_not_read(dashboard_schema: dict) -> None:
    """The check is not vacuous: a misspelt field, a grid position as text and an unknown variable type fail."""
    good = _load(ROOT / "deploy/grafana/dashboards/ibpool-overview.json")
    assert _schema_errors(dashboard_schema, good) == []
    for spoil in (
        lambda d: d.__setitem__("titel", "x"),
        lambda d: d["panels"][1]["gridPos"].__setitem__("w", "half"),
        lambda d: d["templating"]["list"][1].__setitem__("type", "prometheus-query"),
        lambda d: d["panels"][1].__setitem__("datasource", "Prometheus"),
    ):
        bad = copy.deepcopy(good)
        spoil(bad)
        assert _schema_errors(dashboard_schema, bad), spoil


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_has_datasource_cluster_and_instance_variables_and_uses_them(path: Path) -> None:
    dash = _load(path)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["cluster"]["type"] == "query" and variables["instance"]["type"] == "query"
    assert variables["instance"]["multi"] and variables["instance"]["includeAll"]
    ds = {"type": "prometheus", "uid": "${datasource}"}
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            assert v["datasource"] == ds, v["name"]
    panels = _panels(dash)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
    for p in panels:
        if p["type"] == "row":
            continue
        assert p["datasource"] == ds, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t.get("datasource", ds) == ds, p["title"]
            assert "$cluster" in t["expr"] or "${cluster}" in t["expr"], f"{p['title']}: not filtered by cluster"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_panels_do_not_overlap(path: Path) -> None:
    taken: dict[tuple[int, int], str] = {}
    for p in _panels(_load(path)):
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, f"{p['title']!r} overlaps {taken[(x, y)]!r}"
                taken[(x, y)] = p["title"]


def test_dashboard_uids_are_unique() -> None:
    uids = [_load(p)["uid"] for p in DASHBOARDS]
    assert len(uids) == len(set(uids)), uids


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_series_and_label_on_the_dashboard_is_exported_by_the_code(path: Path) -> None:
    series = series_labels()
    dash = _load(path)
    problems = [f"{where}: {p}" for where, expr in _exprs(dash) for p in unknown_names_and_labels(expr, series)]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            selector, label = LABEL_VALUES.match(v["query"]).groups()  # type: ignore[union-attr]
            names = {n for n in series if selector and re.match(rf"{n}\b", selector)}
            if label not in TARGET_LABELS and not any(label in series[n] for n in names):
                problems.append(f"variable {v['name']}: label {label} is on none of {sorted(names)}")
    assert not problems, "\n".join(problems)


def test_the_name_check_sees_unknown_series_and_labels() -> None:
    series = series_labels()
    assert unknown_names_and_labels('sum by (model) (ibpool_pool_gpus{cluster=~"$cluster"})', series) == []
    assert unknown_names_and_labels("rate(ibpool_pool_grants_total[5m])", series) == []
    assert unknown_names_and_labels("rate(ibpool_pool_grants[5m])", series) == [
        "series ibpool_pool_grants is exported by no service"
    ]
    assert unknown_names_and_labels("sum by (modle) (ibpool_pool_gpus)", series) == [
        "label modle is on none of ['ibpool_pool_gpus']"
    ]
    assert unknown_names_and_labels('max(DCGM_FI_DEV_GPU_TEMP{Hostname="h1"})', series) == []


def test_every_expression_on_the_dashboards_parses(tmp_path: Path) -> None:
    tool = promtool()
    if tool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package)")
    rules = []
    for path in DASHBOARDS:
        for i, (where, expr) in enumerate(_exprs(_load(path))):
            name = f"{path.stem.replace('-', '_')}:expr_{i}"
            rules.append({"record": name, "expr": _fill_grafana_variables(expr), "labels": {"where": where}})
    assert len(rules) > 100
    rule_file = tmp_path / "dashboard_exprs.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    r = subprocess.run([tool, "check", "rules", str(rule_file)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(rules)} rules found" in r.stdout


def test_a_broken_expression_fails_promtool(tmp_path: Path) -> None:
    tool = promtool()
    if tool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package)")
    rule_file = tmp_path / "bad.yml"
    bad = _fill_grafana_variables('sum by (model) (rate(ibpool_pool_gpus{cluster=~"$cluster"}[$__rate_interval])')
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [{"record": "r:x", "expr": bad}]}]}))
    r = subprocess.run([tool, "check", "rules", str(rule_file)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
