"""What the services really export on /metrics, read from the code, and the names and labels a PromQL
expression uses: so dashboards and alert rules are checked against the code, not against a list kept by hand.

Metrics are found as prometheus_client constructor calls with a literal name (`Counter("ibpool_x", ...)`,
`GaugeMetricFamily(...)`) in libs/ and services/ (tests excluded), with their literal label names; the
series names are the ones prometheus_client writes (a Counter `x` is `x_total`, a Histogram `x` is
`x_bucket`, `x_sum`, `x_count`). The node agent's dcgm-exporter names (services/node_agent/.../dcgm.py)
are `(name, help)` tuples with the labels of `gpu_labels` and the XID's `err_code` / `err_msg`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DCGM = ROOT / "services/node_agent/ibpool_node_agent/dcgm.py"

# constructor -> suffixes of the series it writes (prometheus_client's exposition)
SERIES_SUFFIXES = {
    "Counter": ("_total", "_created"),
    "Gauge": ("",),
    "Histogram": ("_bucket", "_sum", "_count", "_created"),
    "Summary": ("", "_sum", "_count", "_created"),
    "Info": ("_info",),
    "Enum": ("",),
    "GaugeMetricFamily": ("",),
    "CounterMetricFamily": ("_total", "_created"),
    "HistogramMetricFamily": ("_bucket", "_sum", "_count"),
    "SummaryMetricFamily": ("", "_sum", "_count"),
    "InfoMetricFamily": ("_info",),
}
# labels a series may carry besides its own: Prometheus's target labels (deploy/prometheus/prometheus.yml
# adds `cluster`), a histogram bucket's `le`, a summary's `quantile`.
TARGET_LABELS = frozenset({"job", "instance", "cluster", "le", "quantile"})
# series Prometheus itself writes for every target or rule
PROMETHEUS_SERIES = {"up": frozenset(), "scrape_duration_seconds": frozenset(), "ALERTS": frozenset({"alertname"})}


@dataclass(frozen=True)
class Exported:
    name: str  # the name in the code
    kind: str  # the constructor
    labels: frozenset[str]
    where: str  # path:line


def _literal_labels(call: ast.Call) -> frozenset[str]:
    node = next((k.value for k in call.keywords if k.arg in ("labelnames", "labels")), None)
    if node is None and len(call.args) >= 3:
        node = call.args[2]
    if isinstance(node, ast.List | ast.Tuple):
        return frozenset(e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return frozenset()


def _source_files() -> list[Path]:
    files = [p for d in ("libs", "services") for p in (ROOT / d).rglob("*.py")]
    return sorted(p for p in files if "tests" not in p.relative_to(ROOT).parts and ".venv" not in p.parts)


def exported_metrics() -> list[Exported]:
    """Every metric the services define with a literal name, and the dcgm-exporter GPU fields."""
    found: list[Exported] = []
    for path in _source_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            func = node.func
            kind = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            first = node.args[0]
            if kind in SERIES_SUFFIXES and isinstance(first, ast.Constant) and isinstance(first.value, str):
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.append(Exported(first.value, kind, _literal_labels(node), where))
    found.extend(_dcgm_fields())
    return found


def _dcgm_fields() -> list[Exported]:
    source = DCGM.read_text()
    tree = ast.parse(source)
    labels: set[str] = {"err_code", "err_msg"}  # added to DCGM_FI_DEV_XID_ERRORS only; kept simple here
    fields: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "gpu_labels":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Dict):
                    labels |= {k.value for k in sub.keys if isinstance(k, ast.Constant)}
                if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant):
                    labels.add(sub.slice.value)
        if (
            isinstance(node, ast.Tuple)
            and len(node.elts) == 2
            and isinstance(node.elts[0], ast.Constant)
            and str(node.elts[0].value).startswith("DCGM_FI_")
        ):
            fields.append((node.elts[0].value, node.lineno))
    where = str(DCGM.relative_to(ROOT))
    return [Exported(name, "GaugeMetricFamily", frozenset(labels), f"{where}:{line}") for name, line in fields]


def series_labels() -> dict[str, frozenset[str]]:
    """Series name as Prometheus stores it -> the labels it may carry."""
    series = {name: labels | TARGET_LABELS for name, labels in PROMETHEUS_SERIES.items()}
    for m in exported_metrics():
        base = m.name.removesuffix("_total") if m.kind in ("Counter", "CounterMetricFamily") else m.name
        for suffix in SERIES_SUFFIXES[m.kind]:
            series[base + suffix] = series.get(base + suffix, frozenset()) | m.labels | TARGET_LABELS
    return series


# --- what an expression uses -------------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_MATCHERS = re.compile(r"\{([^}]*)\}")
_MATCHER_LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_IDENT = re.compile(r"(?<![\w$.])([A-Za-z_:][A-Za-z0-9_:]*)\b(?!\s*\()")
_RANGE = re.compile(r"\[[^\]]*\]")
# words of PromQL that are not metric names (functions are followed by "(" and never match _IDENT)
_KEYWORDS = frozenset("by without on ignoring group_left group_right and or unless bool offset inf nan Inf NaN".split())


def expression_metrics(expr: str) -> set[str]:
    """The series names `expr` selects."""
    text = _MATCHERS.sub("{}", _STRING.sub('""', expr))
    text = _GROUPING.sub(" ", _RANGE.sub("", text))
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana's $__rate_interval, ${cluster}
    names = {m for m in _IDENT.findall(text) if m not in _KEYWORDS and not re.fullmatch(r"[0-9.eE]+", m)}
    return {n for n in names if not re.fullmatch(r"\d+[smhdwy]", n)}


def expression_labels(expr: str) -> set[str]:
    """The label names `expr` groups, joins or matches on."""
    text = _STRING.sub('""', expr)
    labels = {x.strip() for group in _GROUPING.findall(text) for x in group.split(",") if x.strip()}
    for matchers in _MATCHERS.findall(text):
        labels |= set(_MATCHER_LABEL.findall(matchers))
    return labels - {"__name__"}


def unknown_names_and_labels(expr: str, series: dict[str, frozenset[str]]) -> list[str]:
    """What in `expr` no service exports: unknown series, and labels none of its series carry."""
    used = expression_metrics(expr)
    problems = [f"series {n} is exported by no service" for n in sorted(used - series.keys())]
    known = used & series.keys()
    if used and not known:
        return problems  # the unknown series says it all
    labels = set().union(*(series[n] for n in known)) if known else set(TARGET_LABELS)
    problems += [f"label {label} is on none of {sorted(known)}" for label in sorted(expression_labels(expr) - labels)]
    return problems
