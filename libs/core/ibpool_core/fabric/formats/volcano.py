"""Volcano HyperNodes (`topology.volcano.sh/v1alpha1`, kind HyperNode) as a multi-document YAML.

One HyperNode per unit of the exported tree (`hierarchy.build_hierarchy`): leaf groups are tier 1
with `type: Node` members; a parent's tier is one more than its highest child and its members are
`type: HyperNode`. Members use `exactMatch` (one per node or child), or with `regex=True` one
`regexMatch` per leaf group built from its hostlist ranges (`gpu[001-032]` ->
`^gpu(?:0(?:0[1-9]|[1-2][0-9]|3[0-2]))$`). HyperNode names are the k8s names of the units (as in
the node-label export); node names are lower case, as Kubernetes names them.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from typing import Any

from ..model import LANE_GBPS, FabricError, Topology
from .diagnostics import Exported, FormatError, dump_yaml, line_of, load_yaml, where
from .hierarchy import TreeEntry, build_hierarchy, check_tree, topology_from_tree, unique_names
from .k8s import k8s_name, k8s_node_name
from .slurm import compress_hostlist

__all__ = ["API_VERSION", "export_volcano", "hostlist_regex", "import_volcano"]

API_VERSION = "topology.volcano.sh/v1alpha1"
_RANGE_PIECE = re.compile(r"^([^\[\],]*)\[([0-9,\-]+)\]([^\[\],]*)$")


def _split_top(expression: str) -> list[str]:
    pieces, depth, current = [], 0, ""
    for char in expression:
        if char == "," and depth == 0:
            pieces.append(current)
            current = ""
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        current += char
    pieces.append(current)
    return [p for p in pieces if p]


def _fixed(lo: str, hi: str) -> list[str]:
    """Regex alternatives for the numbers lo..hi, written with len(lo) == len(hi) digits."""
    if lo == hi:
        return [lo]
    if lo[0] == hi[0]:
        return [lo[0] + rest for rest in _alternatives(_fixed(lo[1:], hi[1:]))]
    n = len(lo) - 1
    out: list[str] = []
    low_full, high_full = lo[1:] == "0" * n, hi[1:] == "9" * n
    first = int(lo[0]) if low_full else int(lo[0]) + 1
    last = int(hi[0]) if high_full else int(hi[0]) - 1
    if not low_full:
        out += [lo[0] + rest for rest in _alternatives(_fixed(lo[1:], "9" * n))]
    if first <= last:
        out.append((str(first) if first == last else f"[{first}-{last}]") + "[0-9]" * n)
    if not high_full:
        out += [hi[0] + rest for rest in _alternatives(_fixed("0" * n, hi[1:]))]
    return out


def _alternatives(options: list[str]) -> list[str]:
    return options if len(options) == 1 else [f"(?:{'|'.join(options)})"]


def _number_range(lo_text: str, hi_text: str) -> list[str]:
    width = len(lo_text)
    lo, hi = int(lo_text), int(hi_text)
    if (lo_text.startswith("0") and width > 1) or len(hi_text) == width:
        return _fixed(str(lo).zfill(width), str(hi).zfill(width))
    out: list[str] = []  # unpadded numbers of several lengths: one fixed-width range per length
    while lo <= hi:
        top = min(hi, 10 ** len(str(lo)) - 1)
        out += _fixed(str(lo), str(top))
        lo = top + 1
    return out


def hostlist_regex(names: Iterable[str]) -> str:
    """An anchored regex (RE2 and Python syntax) matching exactly `names`, built from their hostlist."""
    parts: list[str] = []
    for piece in _split_top(compress_hostlist(list(names))):
        match = _RANGE_PIECE.match(piece)
        if not match:
            parts.append(re.escape(piece))
            continue
        prefix, ranges, suffix = match.groups()
        numbers: list[str] = []
        for item in ranges.split(","):
            lo, _, hi = item.partition("-")
            numbers += _number_range(lo, hi or lo)
        parts.append(f"{re.escape(prefix)}{_alternatives(numbers)[0]}{re.escape(suffix)}")
    return f"^{_alternatives(parts)[0]}$"


def export_volcano(topology: Topology, *, nodes: Collection[str] | None = None, regex: bool = False) -> Exported:
    """HyperNode objects for the tree of `topology` (see the module docstring)."""
    hierarchy = build_hierarchy(topology, nodes=nodes)
    warnings = list(hierarchy.warnings)
    walk = hierarchy.walk()
    names = unique_names(walk, k8s_name)
    # The nodes of each leaf group that can be Kubernetes nodes (the HyperNode CRD takes node names
    # only: `x5570_comp1` is refused), as the k8s-labels export leaves the others out; a HyperNode
    # left with no member is not written, nor named by its parent.
    members_of: dict[str, list[dict[str, Any]]] = {}
    seen: dict[str, str] = {}
    for unit_name in reversed(walk):  # children before their parents
        unit = hierarchy.units[unit_name]
        if unit.hosts:
            node_names = []
            for host in sorted(unit.hosts):
                node = k8s_node_name(host)
                if node is None:
                    warnings.append(f"host {host!r} is not a valid Kubernetes node name; left out")
                elif node in seen:
                    warnings.append(f"hosts {seen[node]!r} and {host!r} are both node {node!r}; kept the first")
                else:
                    seen[node] = host
                    node_names.append(node)
            node_names.sort()
            if not node_names:
                continue
            if regex:
                members_of[unit_name] = [
                    {"type": "Node", "selector": {"regexMatch": {"pattern": hostlist_regex(node_names)}}}
                ]
            else:
                members_of[unit_name] = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in node_names]
        else:
            kept = [c for c in unit.children if c in members_of]
            if kept:
                members_of[unit_name] = [
                    {"type": "HyperNode", "selector": {"exactMatch": {"name": names[c]}}} for c in kept
                ]
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": API_VERSION,
            "kind": "HyperNode",
            "metadata": {"name": names[unit_name]},
            "spec": {"tier": hierarchy.units[unit_name].tier, "members": members_of[unit_name]},
        }
        for unit_name in walk
        if unit_name in members_of
    ]
    if not docs:
        warnings.append("no host is cabled to a switch: no HyperNodes")
    header = f"# Volcano HyperNodes written by ibpool from topology {topology.name!r}\n"
    return Exported(header + dump_yaml(docs, stream=True), warnings)


def import_volcano(
    text: str,
    *,
    file: str = "<hypernodes>",
    nodes: Collection[str] | None = None,
    name: str = "fabric",
    speed: str = "NDR",
    strict: bool = True,
) -> Topology:
    """HyperNodes back to a tree. `regexMatch` node members are matched against `nodes` plus every
    node named by an `exactMatch`; `labelMatch` members cannot be resolved here and are warned about."""
    if speed not in LANE_GBPS:
        raise ValueError(f"speed {speed!r} is not one of {', '.join(LANE_GBPS)}")
    if not text.strip():
        raise FormatError(file, 1, "empty file: no HyperNode objects")
    docs = [
        d for d in load_yaml(text, file, documents=True) if not (isinstance(d, dict) and d.get("kind") != "HyperNode")
    ]
    warnings: list[str] = []
    raw: list[tuple[int | None, str, int | None, list[tuple[str, str, str]]]] = []
    known_nodes: set[str] = set(nodes or ())
    for doc in docs:
        line = line_of(doc)
        if not isinstance(doc, dict):
            raise FormatError(file, line, "expected a HyperNode object")
        metadata, spec = doc.get("metadata"), doc.get("spec")
        if not isinstance(metadata, dict) or not metadata.get("name") or not isinstance(spec, dict):
            raise FormatError(file, line, "a HyperNode needs metadata.name and spec")
        tier = spec.get("tier")
        members: list[tuple[str, str, str]] = []
        for member in spec.get("members") or []:
            at = line_of(member) or line
            kind = member.get("type") if isinstance(member, dict) else None
            selector = member.get("selector") if isinstance(member, dict) else None
            if kind not in ("Node", "HyperNode") or not isinstance(selector, dict) or len(selector) != 1:
                raise FormatError(file, at, "a member needs type Node or HyperNode and exactly one selector")
            how, spec_value = next(iter(selector.items()))
            if how == "exactMatch" and isinstance(spec_value, dict) and spec_value.get("name"):
                members.append((str(kind), "exact", str(spec_value["name"])))
                if kind == "Node":
                    known_nodes.add(str(spec_value["name"]))
            elif how == "regexMatch" and isinstance(spec_value, dict) and spec_value.get("pattern"):
                members.append((str(kind), "regex", str(spec_value["pattern"])))
            else:
                warnings.append(where(file, at, f"{how} selector of {metadata['name']} not resolved here; left out"))
        raw.append((line, str(metadata["name"]), tier if isinstance(tier, int) else None, members))
    hypernodes = [r[1] for r in raw]
    entries: list[TreeEntry] = []
    tiers: dict[str, int | None] = {}
    for line, hn, tier, members in raw:
        tiers[hn] = tier
        children: list[str] = []
        hosts: list[str] = []
        for kind, how, value in members:
            pool = hypernodes if kind == "HyperNode" else sorted(known_nodes)
            if how == "exact":
                found = [value]
            else:
                try:
                    pattern = re.compile(value)
                except re.error as error:
                    raise FormatError(file, line, f"bad regexMatch pattern {value!r}: {error}") from None
                found = [n for n in pool if pattern.fullmatch(n)]
                if not found:
                    warnings.append(where(file, line, f"regexMatch {value!r} of {hn} matches no known {kind}"))
            (children if kind == "HyperNode" else hosts).extend(found)
        entries.append(TreeEntry(line, hn, children or None, hosts or None))
    order, kids, members_of = check_tree(entries, file, strict, warnings)
    for parent, children in kids.items():
        for child in children:
            tp, tc = tiers.get(parent), tiers.get(child)
            if tp is not None and tc is not None and tc >= tp:
                line = next(e.line for e in entries if e.name == parent)
                warnings.append(where(file, line, f"HyperNode {parent} (tier {tp}) has member {child} of tier {tc}"))
    try:
        return topology_from_tree(
            name=name, switches=order, children=kids, nodes=members_of, warnings=warnings, speed=speed
        )
    except FabricError as error:
        raise FormatError(file, None, str(error)) from None
