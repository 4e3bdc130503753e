"""Kubernetes node labels for topology-aware schedulers (Kueue TAS, KAI): one label per tree level.

Each host becomes a `v1 Node` carrying `kubernetes.io/hostname` and one `ibpool.io/<level>` label
per level of the exported tree (`hierarchy.build_hierarchy`), named from the bottom: `leaf` (the
leaf group), `spine`, `core`, then `tier4`, `tier5`... (the top level is shared by every node
of one part of the fabric: a job that may span all of it; a disconnected fabric has a top value
per part). A host whose leaf group sits higher than the
deepest one repeats its leaf group's value in the lower levels, so every node has every level and
each value has one parent (what Kueue's Topology levels need). Values are the unit names made
valid label values and DNS names (lower case, `[a-z0-9.-]`, at most 63 characters): the same names
the Volcano export gives its HyperNodes. Node names are the host names in lower case.

YAML output is a multi-document stream of Node objects (apply with `kubectl apply --server-side`
or read the labels from it); JSON is one `v1 List`. `import_k8s_labels` reads either back.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Collection
from typing import Any, Literal

from ..model import LANE_GBPS, FabricError, Topology
from .diagnostics import Exported, FormatError, dump_yaml, line_of, load_yaml
from .hierarchy import Hierarchy, TreeEntry, build_hierarchy, check_tree, topology_from_tree, unique_names

__all__ = ["LABEL_PREFIX", "export_k8s_labels", "import_k8s_labels", "k8s_name", "label_levels"]

LABEL_PREFIX = "ibpool.io"
HOSTNAME_LABEL = "kubernetes.io/hostname"
_LEVEL_NAMES = {1: "leaf", 2: "spine", 3: "core"}
_INVALID = re.compile(r"[^a-z0-9.-]+")
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def k8s_name(name: str) -> str:
    """`name` as a DNS label / label value: lower case, [a-z0-9.-], alphanumeric at both ends, <= 63."""
    clean = _INVALID.sub("-", name.lower()).strip("-.")
    if len(clean) > 63:
        clean = clean[:54].rstrip("-.") + "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return clean or "x"


def k8s_node_name(host: str) -> str | None:
    """The Kubernetes node name of `host` (lower case), or None when it cannot be one (a DNS
    subdomain: `[a-z0-9.-]`, alphanumeric at both ends, at most 253 characters)."""
    node = host.lower()
    return node if _NODE_NAME.match(node) and len(node) <= 253 else None


def _level_label(index: int, prefix: str) -> str:
    return f"{prefix}/{_LEVEL_NAMES.get(index, f'tier{index}')}"


def label_levels(hierarchy: Hierarchy, prefix: str = LABEL_PREFIX) -> list[str]:
    """The label keys top-down, ending with kubernetes.io/hostname (a Kueue Topology's levels)."""
    depths = hierarchy.depths()
    deepest = max((depths[u.name] for u in hierarchy.leaf_units()), default=0)
    return [_level_label(i, prefix) for i in range(deepest + 1, 0, -1)] + [HOSTNAME_LABEL]


def export_k8s_labels(
    topology: Topology,
    *,
    nodes: Collection[str] | None = None,
    fmt: Literal["yaml", "json"] = "yaml",
    prefix: str = LABEL_PREFIX,
) -> Exported:
    """Node objects with the topology labels of every host (see the module docstring)."""
    hierarchy = build_hierarchy(topology, nodes=nodes)
    warnings = list(hierarchy.warnings)
    walk = hierarchy.walk()
    values = unique_names(walk, k8s_name)
    depths = hierarchy.depths()
    parents = hierarchy.parents()
    levels = label_levels(hierarchy, prefix)
    count = len(levels) - 1  # topology levels, without the hostname
    items: list[dict[str, Any]] = []
    node_names: dict[str, str] = {}
    for unit in hierarchy.leaf_units():
        path = [unit.name]
        while path[-1] in parents:
            path.append(parents[path[-1]])
        path.reverse()  # root first
        by_depth = {depths[n]: n for n in path}
        for host in unit.hosts:
            node = k8s_node_name(host)
            if node is None:
                warnings.append(f"host {host!r} is not a valid Kubernetes node name; left out")
                continue
            if node != host:
                warnings.append(f"host {host!r} is named {node!r} in Kubernetes (node names are lower case)")
            if node in node_names:
                warnings.append(f"hosts {node_names[node]!r} and {host!r} are both node {node!r}; kept the first")
                continue
            node_names[node] = host
            labels: dict[str, str] = {}
            for depth in range(count):
                owner = by_depth.get(depth, unit.name)  # below its leaf group: repeat the leaf group
                labels[levels[depth]] = values[owner]
            labels[HOSTNAME_LABEL] = node
            items.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": labels}})
    if not items:
        warnings.append("no host is cabled to a switch: no labels")
    if fmt == "json":
        return Exported(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2) + "\n", warnings)
    header = (
        f"# Kubernetes node labels written by ibpool from topology {topology.name!r}\n"
        f"# Topology levels, top to bottom (Kueue Topology spec.levels): {', '.join(levels)}\n"
    )
    return Exported(header + dump_yaml(items, stream=True), warnings)


def _level_rank(key: str, prefix: str) -> int | None:
    if not key.startswith(prefix + "/"):
        return None
    level = key[len(prefix) + 1 :]
    for rank, label in _LEVEL_NAMES.items():
        if level == label:
            return rank
    match = re.fullmatch(r"tier(\d+)", level)
    return int(match[1]) if match else None


def import_k8s_labels(
    text: str,
    *,
    file: str = "<labels>",
    name: str = "fabric",
    prefix: str = LABEL_PREFIX,
    speed: str = "NDR",
) -> Topology:
    """Nodes with `ibpool.io/<level>` labels (YAML stream, a JSON v1 List, or a list of Nodes) as a tree."""
    if speed not in LANE_GBPS:
        raise ValueError(f"speed {speed!r} is not one of {', '.join(LANE_GBPS)}")
    if not text.strip():
        raise FormatError(file, 1, "empty file: no Node objects")
    items: list[Any]
    if text.lstrip().startswith(("{", "[")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise FormatError(file, error.lineno, f"not valid JSON: {error.msg}") from None
        items = data.get("items", []) if isinstance(data, dict) and "items" in data else data
        items = items if isinstance(items, list) else [items]
    else:
        docs = load_yaml(text, file, documents=True)
        items = []
        for doc in docs:
            items.extend(doc.get("items", []) if isinstance(doc, dict) and doc.get("kind") == "List" else [doc])
    warnings: list[str] = []
    parent: dict[str, str] = {}
    parent_line: dict[str, int | None] = {}
    leaf_of: dict[str, list[str]] = {}
    order: list[str] = []
    for item in items:
        line = line_of(item)
        metadata = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(metadata, dict) or not metadata.get("name"):
            raise FormatError(file, line, "expected a Node object with metadata.name")
        node = str(metadata["name"])
        labels = metadata.get("labels") or {}
        if not isinstance(labels, dict):
            raise FormatError(file, line_of(metadata) or line, f"labels of {node} are not a mapping")
        ranked = sorted(
            ((rank, str(v)) for k, v in labels.items() if (rank := _level_rank(str(k), prefix)) is not None),
            reverse=True,
        )
        if not ranked:
            warnings.append(f"{file}:{line}: node {node} has no {prefix}/ labels; left out")
            continue
        chain = [v for _, v in ranked]
        for upper, lower in itertools.pairwise(chain):
            if upper == lower:
                continue
            if parent.get(lower, upper) != upper:
                raise FormatError(
                    file,
                    line,
                    f"{lower} is under {parent[lower]} (line {parent_line[lower]}) and under {upper} here",
                )
            parent[lower] = upper
            parent_line[lower] = line
        for value in chain:
            if value not in order:
                order.append(value)
        leaf_of.setdefault(chain[-1], []).append(node)
    children: dict[str, list[str]] = {}
    for child, up in parent.items():
        children.setdefault(up, []).append(child)
    entries = [TreeEntry(parent_line.get(v), v, children.get(v) or None, leaf_of.get(v) or None) for v in order]
    order, children, nodes = check_tree(entries, file, True, warnings)
    try:
        return topology_from_tree(
            name=name, switches=order, children=children, nodes=nodes, warnings=warnings, speed=speed
        )
    except FabricError as error:
        raise FormatError(file, None, str(error)) from None
