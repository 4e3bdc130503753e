"""Slurm topology files: topology.conf (topology/tree and topology/block) and topology.yaml.

Import: a tree (`SwitchName=s Switches=...` / `SwitchName=s Nodes=gpu[001-032,040]`) becomes
switches named as in the file, with made-up stable GUIDs, one CA per node on its leaf, links child
-> parent; a block file (`BlockName=b Nodes=...`, `BlockSizes=...`) becomes one leaf switch per
block. Errors (`FormatError`, "FILE:LINE: reason"): an undefined switch, a cycle (two switches that
list each other, as slurmctld refuses: "not a tree"), a switch defined twice, a bad hostlist, an
unknown line. With `strict=False` those become warnings and the offending part is left out (to
read files slurmctld would refuse, such as a site's hand-made one).

Export: the tree of `hierarchy.build_hierarchy` (leaf groups; multi-rail hosts under the group of
leaves they share), which slurmctld accepts: one top per part of the fabric that links join (a
disconnected fabric stays disconnected), every node under exactly one leaf, no switch listing its
parent; tests/integration/test_slurm_topology.py has a real slurmctld read them. Node names are
hostlist-compressed in the forms Slurm's parser reads (`compress_hostlist`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection
from typing import Any, Literal

import hostlist  # type: ignore[import-untyped]

from ..model import LANE_GBPS, FabricError, Topology
from .diagnostics import Exported, FormatError, dump_yaml, line_of, load_yaml, where
from .hierarchy import TreeEntry, build_hierarchy, check_tree, nothing_to_export, topology_from_tree, unique_names

__all__ = [
    "compress_hostlist",
    "expand_hostlist",
    "export_slurm_block",
    "export_slurm_tree",
    "export_slurm_yaml",
    "import_slurm",
    "import_slurm_block",
    "import_slurm_tree",
    "import_slurm_yaml",
]

_BAD_NAME = re.compile(r"[^A-Za-z0-9_.\-]")
_NODE_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def expand_hostlist(expression: str, *, file: str = "<hostlist>", line: int | None = None) -> list[str]:
    """`gpu[001-003,040]` -> ["gpu001", "gpu002", "gpu003", "gpu040"] (FormatError when malformed)."""
    try:
        names: list[str] = hostlist.expand_hostlist(expression)
    except hostlist.BadHostlist as error:
        raise FormatError(file, line, f"bad hostlist {expression!r}: {error}") from None
    except RecursionError:  # python-hostlist recurses once per part: a pathological expression
        raise FormatError(file, line, f"bad hostlist {expression[:80]!r}: nested too deeply to expand") from None
    return names


_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")


def compress_hostlist(names: Collection[str]) -> str:
    """A hostlist expression for `names` in the only forms Slurm's own parser reads back.

    Slurm (22.05) takes a bracket range at the end of a name only (`node[01-03]`; `node[01-02]-ib`
    and `r[1-2]n1` are "Invalid hostlist"), so only a name's trailing number is ranged; a name with
    none, or with text after its digits, is listed as it is. Zero-padded numbers are ranged only with
    numbers of the same width (`node[08-10]` expands to node08..node10; `n[9-10]` to n9, n10). Groups
    are in name order, ranges ascending: the same names give the same text. Checked against
    `scontrol show hostnames` (libs/core/tests/test_slurm_hostlists.py)."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in set(names):
        m = _TRAILING_NUMBER.match(name)
        if m is None:
            plain.append(name)
            continue
        prefix, digits = m.group(1), m.group(2)
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups.setdefault((prefix, width), []).append(int(digits))
    # An unpadded number as wide as a padded group of its prefix reads the same inside it (node10 in node[08-10]).
    for prefix, _ in [k for k in groups if k[1] == 0]:
        unpadded = groups[(prefix, 0)]
        for n in list(unpadded):
            if (prefix, len(str(n))) in groups:
                groups[(prefix, len(str(n)))].append(n)
                unpadded.remove(n)
        if not unpadded:
            del groups[(prefix, 0)]
    pieces: list[tuple[str, str]] = [(name, name) for name in plain]
    for (prefix, width), numbers in groups.items():
        numbers.sort()
        if len(numbers) == 1:
            text = f"{prefix}{numbers[0]:0{width}d}"
            pieces.append((text, text))
            continue
        runs: list[str] = []
        for _, run in itertools.groupby(enumerate(numbers), key=lambda iv: iv[1] - iv[0]):
            values = [v for _, v in run]
            lo, hi = f"{values[0]:0{width}d}", f"{values[-1]:0{width}d}"
            runs.append(lo if lo == hi else f"{lo}-{hi}")
        pieces.append((f"{prefix}{numbers[0]:0{width}d}", f"{prefix}[{','.join(runs)}]"))
    return ",".join(text for _, text in sorted(pieces))


def _conf_lines(text: str) -> list[tuple[int, dict[str, str]]]:
    """(line number, {lower-case key: value}) per statement; comments and continuations handled."""
    out: list[tuple[int, dict[str, str]]] = []
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if not line:
            continue
        pairs: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            pairs[key.lower() if sep else token.lower()] = value if sep else ""
        out.append((start, pairs))
    return out


def _speed(speed: str) -> str:
    if speed not in LANE_GBPS:
        raise ValueError(f"speed {speed!r} is not one of {', '.join(LANE_GBPS)}")
    return speed


def import_slurm_tree(
    text: str, *, file: str = "<topology.conf>", strict: bool = True, name: str = "fabric", speed: str = "NDR"
) -> Topology:
    """A topology/tree topology.conf as a Topology (links taken as 4x`speed`: the file has no rates)."""
    return _import_conf(text, file=file, strict=strict, name=name, speed=_speed(speed), want="tree")


def import_slurm_block(
    text: str, *, file: str = "<topology.conf>", strict: bool = True, name: str = "fabric", speed: str = "NDR"
) -> Topology:
    """A topology/block topology.conf: one leaf switch per block."""
    return _import_conf(text, file=file, strict=strict, name=name, speed=_speed(speed), want="block")


def import_slurm(
    text: str, *, file: str = "<topology.conf>", strict: bool = True, name: str = "fabric", speed: str = "NDR"
) -> Topology:
    """topology.conf (tree or block, told apart by its lines) or topology.yaml (told by its shape)."""
    stripped = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
    first = next((ln for ln in stripped if ln), "")
    if first.startswith("-") or first.startswith("topology:") or first == "---":
        return import_slurm_yaml(text, file=file, strict=strict, name=name, speed=speed)
    return _import_conf(text, file=file, strict=strict, name=name, speed=_speed(speed), want=None)


def _import_conf(text: str, *, file: str, strict: bool, name: str, speed: str, want: str | None) -> Topology:
    if not text.strip():
        raise FormatError(file, 1, "empty file: no topology.conf lines")
    warnings: list[str] = []
    switches: list[TreeEntry] = []
    blocks: list[TreeEntry] = []
    sizes: tuple[int, list[int]] | None = None
    for number, pairs in _conf_lines(text):
        if "switchname" in pairs:
            entry = TreeEntry(number, pairs["switchname"], None, None)
            if "switches" in pairs:
                entry.switches = expand_hostlist(pairs["switches"], file=file, line=number)
            if "nodes" in pairs:
                entry.nodes = expand_hostlist(pairs["nodes"], file=file, line=number)
            extra = set(pairs) - {"switchname", "switches", "nodes", "linkspeed"}
            switches.append(entry)
        elif "blockname" in pairs:
            members = expand_hostlist(pairs.get("nodes", ""), file=file, line=number)
            entry = TreeEntry(number, pairs["blockname"], None, members)
            extra = set(pairs) - {"blockname", "nodes"}
            blocks.append(entry)
        elif "blocksizes" in pairs:
            try:
                sizes = (number, [int(v) for v in pairs["blocksizes"].split(",") if v.strip()])
            except ValueError:
                raise FormatError(file, number, f"BlockSizes={pairs['blocksizes']} is not a list of numbers") from None
            extra = set(pairs) - {"blocksizes"}
        else:
            raise FormatError(
                file, number, f"expected SwitchName=, BlockName= or BlockSizes=, got {' '.join(pairs)[:60]!r}"
            )
        if not all(pairs[k] for k in pairs if k in {"switchname", "blockname"}):
            raise FormatError(file, number, "a SwitchName= or BlockName= without a name")
        if extra:
            warnings.append(where(file, number, f"unknown parameter(s) ignored: {', '.join(sorted(extra))}"))
    if switches and blocks:
        raise FormatError(file, blocks[0].line, "a file with both SwitchName= (tree) and BlockName= (block) lines")
    if want == "tree" and not switches:
        raise FormatError(file, None, "no SwitchName= lines: not a topology/tree file")
    if want == "block" and not blocks:
        raise FormatError(file, None, "no BlockName= lines: not a topology/block file")
    if blocks:
        return _blocks_topology(blocks, sizes, file, strict, warnings, name, speed)
    order, children, nodes = check_tree(switches, file, strict, warnings)
    return _topology(order, children, nodes, warnings, name, speed, file)


def _topology(
    order: list[str],
    children: dict[str, list[str]],
    nodes: dict[str, list[str]],
    warnings: list[str],
    name: str,
    speed: str,
    file: str,
) -> Topology:
    try:
        return topology_from_tree(
            name=name, switches=order, children=children, nodes=nodes, warnings=warnings, speed=speed
        )
    except FabricError as error:
        raise FormatError(file, None, str(error)) from None


def _blocks_topology(
    blocks: list[TreeEntry],
    sizes: tuple[int, list[int]] | None,
    file: str,
    strict: bool,
    warnings: list[str],
    name: str,
    speed: str,
) -> Topology:
    seen_blocks: dict[str, int | None] = {}
    home: dict[str, str] = {}
    nodes: dict[str, list[str]] = {}
    for block in blocks:
        if block.name in seen_blocks:
            reason = f"block {block.name} is defined twice (first at line {seen_blocks[block.name]})"
            if strict:
                raise FormatError(file, block.line, reason)
            warnings.append(where(file, block.line, reason + "; left out"))
            continue
        seen_blocks[block.name] = block.line
        members: list[str] = []
        for node in block.nodes or []:
            if node in home:
                reason = f"node {node} is in blocks {home[node]} and {block.name}"
                if strict:
                    raise FormatError(file, block.line, reason)
                warnings.append(where(file, block.line, reason + f"; kept in {home[node]}"))
                continue
            home[node] = block.name
            members.append(node)
        nodes[block.name] = members
    if sizes is not None:
        line, values = sizes
        smallest = min((len(v) for v in nodes.values()), default=0)
        if any(v < 1 for v in values):
            raise FormatError(file, line, f"BlockSizes={values}: a block size is a number of nodes, at least 1")
        if not values:
            warnings.append(where(file, line, "BlockSizes= is empty"))
        elif any(b <= a or b % a or (b // a) & (b // a - 1) for a, b in itertools.pairwise(values)):
            reason = f"BlockSizes={values}: each size must be a power of two times the one before"
            warnings.append(where(file, line, reason))
        elif values[0] > smallest:
            reason = f"a block has {smallest} nodes, fewer than the base block size {values[0]}"
            warnings.append(where(file, line, reason))
    order = list(nodes)
    return _topology(order, {}, nodes, warnings, name, speed, file)


def import_slurm_yaml(
    text: str,
    *,
    file: str = "<topology.yaml>",
    topology: str | None = None,
    strict: bool = True,
    name: str = "fabric",
    speed: str = "NDR",
    kind: Literal["tree", "block"] | None = None,
) -> Topology:
    """One topology of a topology.yaml (Slurm 25.05+): the one named `topology`, else the first
    with `cluster_default: true`, else the first tree or block one (only `kind` ones, if given)."""
    _speed(speed)
    data = load_yaml(text, file)
    if data is None:
        raise FormatError(file, 1, "empty file: no topology.yaml content")
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise FormatError(file, 1, "topology.yaml must be a list of topologies (- topology: NAME ...)")
    chosen: dict[str, Any] | None = None
    if topology is not None:
        chosen = next((t for t in data if t.get("topology") == topology), None)
        if chosen is None:
            known = ", ".join(str(t.get("topology")) for t in data)
            raise FormatError(file, None, f"no topology named {topology!r} (there are: {known})")
    else:
        structured = [t for t in data if ("tree" in t or "block" in t) and (kind is None or kind in t)]
        chosen = next((t for t in structured if t.get("cluster_default") is True), None)
        chosen = chosen or (structured[0] if structured else None)
        if chosen is None:
            wanted = f"{kind} topology" if kind else "tree or block topology"
            raise FormatError(file, line_of(data[0]) if data else 1, f"no {wanted} in the file")
    line = line_of(chosen)
    warnings: list[str] = []
    if "tree" in chosen:
        tree = chosen["tree"]
        switches = tree.get("switches") if isinstance(tree, dict) else None
        if not isinstance(switches, list):
            raise FormatError(file, line_of(tree) or line, "tree: needs a list of switches")
        entries: list[TreeEntry] = []
        for item in switches:
            at = line_of(item) or line
            if not isinstance(item, dict) or not item.get("switch"):
                raise FormatError(file, at, "every switch needs a name (- switch: NAME)")
            entries.append(
                TreeEntry(
                    at,
                    str(item["switch"]),
                    _names(item.get("children"), file, at),
                    _names(item.get("nodes"), file, at),
                )
            )
        order, children, nodes = check_tree(entries, file, strict, warnings)
        return _topology(order, children, nodes, warnings, name, speed, file)
    if "block" in chosen:
        block = chosen["block"]
        items = block.get("blocks") if isinstance(block, dict) else None
        if not isinstance(items, list):
            raise FormatError(file, line_of(block) or line, "block: needs a list of blocks")
        blocks: list[TreeEntry] = []
        for item in items:
            at = line_of(item) or line
            if not isinstance(item, dict) or not item.get("block"):
                raise FormatError(file, at, "every block needs a name (- block: NAME)")
            blocks.append(TreeEntry(at, str(item["block"]), None, _names(item.get("nodes"), file, at) or []))
        raw_sizes = block.get("block_sizes")
        sizes = None
        if raw_sizes is not None:
            if not isinstance(raw_sizes, list) or not all(isinstance(v, int) for v in raw_sizes):
                raise FormatError(file, line_of(block) or line, "block_sizes must be a list of numbers")
            sizes = (line_of(block) or line or 1, [int(v) for v in raw_sizes])
        return _blocks_topology(blocks, sizes, file, strict, warnings, name, speed)
    raise FormatError(file, line, f"topology {chosen.get('topology')!r} is neither tree nor block")


def _names(value: object, file: str, line: int | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return [n for v in value for n in expand_hostlist(str(v), file=file, line=line)]
    return expand_hostlist(str(value), file=file, line=line)


def _slurm_name(name: str) -> str:
    return _BAD_NAME.sub("-", name)[:64] or "switch"


def _exportable(topology: Topology, nodes: Collection[str] | None, warnings: list[str]) -> list[str]:
    selected = None if nodes is None else set(nodes)
    wanted = [h.name for h in topology.hosts if selected is None or h.name in selected]
    bad = [h for h in wanted if not _NODE_NAME.match(h)]
    if bad:
        warnings.append(f"{len(bad)} host name(s) cannot be written in a Slurm hostlist and are left out: {bad[:5]}")
    good = [h for h in wanted if _NODE_NAME.match(h)]
    if selected is not None:
        missing = sorted(selected - {h.name for h in topology.hosts})
        if missing:
            warnings.append(f"{len(missing)} selected node(s) are not in the topology: {', '.join(missing[:10])}")
    return good


def export_slurm_tree(topology: Topology, *, nodes: Collection[str] | None = None) -> Exported:
    """topology.conf for topology/tree: a tree slurmctld accepts (each node under one leaf; one top
    switch per part of the fabric that links join, so a disconnected fabric stays disconnected)."""
    warnings: list[str] = []
    hierarchy = build_hierarchy(topology, nodes=_exportable(topology, nodes, warnings))
    warnings += hierarchy.warnings
    lines = [f"# Slurm topology.conf (topology/tree) written by ibpool from topology {topology.name!r}"]
    if not hierarchy.roots:
        raise FabricError(nothing_to_export(hierarchy) + " (slurmctld refuses a topology/tree file without switches)")
    walk = hierarchy.walk()
    names = unique_names(walk, _slurm_name)
    for unit_name in walk:
        unit = hierarchy.units[unit_name]
        if unit.hosts:
            lines.append(f"SwitchName={names[unit_name]} Nodes={compress_hostlist(unit.hosts)}")
        else:
            lines.append(f"SwitchName={names[unit_name]} Switches={','.join(names[c] for c in unit.children)}")
    return Exported("\n".join(lines) + "\n", warnings)


def _block_sizes(counts: list[int]) -> list[int]:
    base = min(counts)
    sizes = [base]
    while len(sizes) < 16 and 2 ** len(sizes) <= len(counts):
        sizes.append(base * 2 ** len(sizes))
    return sizes


def export_slurm_block(topology: Topology, *, nodes: Collection[str] | None = None) -> Exported:
    """topology.conf for topology/block: one block per leaf group, in tree order (siblings adjacent,
    as Slurm pairs neighbouring blocks), BlockSizes from the smallest block up by powers of two.
    A comment before each multi-leaf block names its leaf switch per rail."""
    warnings: list[str] = []
    hierarchy = build_hierarchy(topology, nodes=_exportable(topology, nodes, warnings))
    warnings += hierarchy.warnings
    lines = [f"# Slurm topology.conf (topology/block) written by ibpool from topology {topology.name!r}"]
    leaves = hierarchy.leaf_units()
    if not leaves:
        raise FabricError(nothing_to_export(hierarchy) + " (slurmctld refuses a topology/block file without blocks)")
    names = unique_names([u.name for u in leaves], _slurm_name)
    switch_names = {s.guid: s.name for s in topology.switches}
    for unit in leaves:
        if len(unit.leaves) > 1:
            lines.append(f"# {names[unit.name]}: leaves {', '.join(switch_names[g] for g in unit.leaves)}")
        lines.append(f"BlockName={names[unit.name]} Nodes={compress_hostlist(unit.hosts)}")
    lines.append("BlockSizes=" + ",".join(str(s) for s in _block_sizes([len(u.hosts) for u in leaves])))
    return Exported("\n".join(lines) + "\n", warnings)


def export_slurm_yaml(topology: Topology, *, nodes: Collection[str] | None = None) -> Exported:
    """topology.yaml (Slurm 25.05+) with two topologies: `<name>-tree` (the cluster default) and
    `<name>-block`, the same content as the two topology.conf exports."""
    warnings: list[str] = []
    hierarchy = build_hierarchy(topology, nodes=_exportable(topology, nodes, warnings))
    warnings += hierarchy.warnings
    base = _slurm_name(topology.name)
    if not hierarchy.roots:
        warnings.append("no host is cabled to a switch: the topologies are empty")
        doc: list[dict[str, Any]] = [{"topology": f"{base}-flat", "cluster_default": True, "flat": True}]
        return Exported(dump_yaml(doc), warnings)
    walk = hierarchy.walk()
    names = unique_names(walk, _slurm_name)
    switches: list[dict[str, Any]] = []
    for unit_name in walk:
        unit = hierarchy.units[unit_name]
        if unit.hosts:
            switches.append({"switch": names[unit_name], "nodes": compress_hostlist(unit.hosts)})
        else:
            switches.append({"switch": names[unit_name], "children": ",".join(names[c] for c in unit.children)})
    leaves = hierarchy.leaf_units()
    blocks = [{"block": names[u.name], "nodes": compress_hostlist(u.hosts)} for u in leaves]
    doc = [
        {"topology": f"{base}-tree", "cluster_default": True, "tree": {"switches": switches}},
        {
            "topology": f"{base}-block",
            "cluster_default": False,
            "block": {"block_sizes": _block_sizes([len(u.hosts) for u in leaves]), "blocks": blocks},
        },
    ]
    header = f"# Slurm topology.yaml written by ibpool from topology {topology.name!r}\n"
    return Exported(header + dump_yaml(doc), warnings)
