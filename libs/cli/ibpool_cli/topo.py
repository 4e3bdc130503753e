"""`ibpool topo`: convert, show, diff and generate fabric topologies (docs/fabric-cli.md).

Exit codes: 0 ok, 1 usage error (bad arguments; argparse's own errors included), 2 input error
(a file that cannot be read or imported, parameters a generator rejects), always with a one-line
message on stderr and never a traceback (IBPOOL_DEBUG=1 re-raises unexpected errors).
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import textwrap
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from ibpool_core.fabric.formats import (
    EXPORT_FORMATS,
    IMPORT_FORMATS,
    FormatError,
    build_hierarchy,
    export_topology,
    guess_format,
    import_topology,
    parse_name_map,
)
from ibpool_core.fabric.formats.slurm import compress_hostlist, expand_hostlist
from ibpool_core.fabric.generators import GENERATORS
from ibpool_core.fabric.index import FabricIndex
from ibpool_core.fabric.model import LANE_GBPS, FabricError, Link, Topology, TopologyDiff, content_hash, diff

PROG = "ibpool topo"
EXIT_OK, EXIT_USAGE, EXIT_INPUT = 0, 1, 2
STDIN = "-"
MAX_WARNINGS_SHOWN = 20


class UsageError(Exception):
    """Arguments that make no sense together (exit 1)."""


class InputError(Exception):
    """A file or parameter that cannot be turned into a topology (exit 2); the message says where."""


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors exit 1 (2 is for input errors here)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


# ----------------------------------------------------------------------------------------- input


def _read_text(path: str) -> str:
    """The text of `path` ('-' = stdin); InputError when it cannot be read as UTF-8 text."""
    try:
        if path == STDIN:
            return sys.stdin.read()
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{_display(path)}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise InputError(f"{_display(path)}: {e.strerror or e}") from None


def _display(path: str) -> str:
    return "<stdin>" if path == STDIN else path


def load(path: str, fmt: str | None, names_file: str | None, rails: str | None = None) -> tuple[Topology, str]:
    """(topology, format used) of `path`; `fmt` None guesses it. `rails`: adapter names in rail order,
    comma-separated. InputError / UsageError on failure."""
    text = _read_text(path)
    kind = fmt or guess_format(path, text)
    for option, value in (("--names", names_file), ("--rails", rails)):
        if value and kind != "ibnetdiscover":
            how = "given" if fmt else "guessed from its content"
            raise UsageError(f"{option} applies to ibnetdiscover input; {_display(path)} reads as {kind} ({how})")
    rail_order = None
    if rails:
        rail_order = [r.strip() for r in rails.split(",")]
        if "" in rail_order or len(set(rail_order)) != len(rail_order):
            raise UsageError(f"--rails {rails!r}: adapter names in rail order, each once, e.g. mlx5_0,mlx5_3")
    names = None
    if names_file:
        try:
            names = parse_name_map(_read_text(names_file), file=names_file)
        except FormatError as e:
            raise InputError(str(e)) from None
    stem = "stdin" if path == STDIN else Path(path).stem
    try:
        topology = import_topology(
            kind, text, file=_display(path), names=names, name=stem or "fabric", rails=rail_order
        )
    except FormatError as e:
        raise InputError(str(e) + ("" if fmt else f" (read as {kind}, guessed; --from picks the format)")) from None
    except (FabricError, ValueError) as e:
        raise InputError(f"{_display(path)}: {e}") from None
    return topology, kind


def _write(path: str | None, text: str) -> None:
    if path is None or path == STDIN:
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
        sys.stdout.flush()
        return
    try:
        Path(path).write_text(text if text.endswith("\n") or not text else text + "\n", encoding="utf-8")
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}") from None


def _warn(messages: Sequence[str]) -> None:
    for message in messages:
        print(f"warning: {message}", file=sys.stderr)


# --------------------------------------------------------------------------------------- convert


def cmd_convert(args: argparse.Namespace) -> int:
    nodes = None
    if args.nodes:
        try:
            nodes = expand_hostlist(args.nodes, file="--nodes")
        except FormatError as e:
            raise UsageError(e.reason) from None
    topology, _ = load(args.file, args.from_format, args.names, args.rails)
    exported = export_topology(args.to, topology, nodes=nodes)
    if not args.quiet:
        _warn([*topology.warnings, *exported.warnings])
    _write(args.output, exported.text)
    return EXIT_OK


# ------------------------------------------------------------------------------------------ show


class TierSummary(msgspec.Struct, kw_only=True):
    """Switches of one tier (1 = leaf; 0 = switches that reach no leaf) and their capacity, Gb/s:
    `down_gbps` towards the tier below (hosts for tier 1), `up_gbps` towards the tier above,
    `oversubscription` = down / up (None at the top, where there is no uplink)."""

    tier: int
    switches: int
    sharp: int
    down_gbps: float
    up_gbps: float
    oversubscription: float | None
    same_tier_links: int


class RateSummary(msgspec.Struct, kw_only=True):
    rate: str  # width x speed, e.g. 4xNDR
    gbps: float
    links: int
    host_links: int
    switch_links: int


class RailSummary(msgspec.Struct, kw_only=True):
    rail: int
    hosts: int  # hosts with a cabled adapter on this rail


class RailCountSummary(msgspec.Struct, kw_only=True):
    rails: int
    hosts: int  # hosts with exactly this many cabled rails


class TreeUnit(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    tier: int
    switches: str = ""  # hostlist-compressed switch names
    hosts: str = ""  # hostlist-compressed host names (leaf groups)
    host_count: int = 0
    children: list[TreeUnit] = []


class Summary(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    file: str
    format: str
    content_hash: str
    hosts: int
    cas: int
    gpus: int
    gpu_models: dict[str, int]
    switches: int
    routers: int
    links: int
    links_by_state: dict[str, int]
    levels: int
    leaf_groups: int
    tree_like: bool
    tiers: list[TierSummary]
    rails: list[RailSummary]
    hosts_by_rail_count: list[RailCountSummary]
    hosts_without_rail: int  # hosts with a cabled adapter that has no rail (one adapter: a single-rail host)
    link_rates: list[RateSummary]
    sharp_switches: int
    largest_sharp_subtree_hosts: int
    bisection_gbps: float | None
    bisection_hosts: int
    warnings: list[str]
    trees: list[TreeUnit] = []  # the exported tree, one per part of the fabric that links join (--tree)


def summarize(topology: Topology, *, file: str, fmt: str) -> Summary:
    index = FabricIndex(topology)
    tiers = index.tiers
    switches = {s.guid: s for s in topology.switches}
    cas = {c.guid for c in topology.cas}

    per_tier: dict[int, dict[str, float]] = {}
    for s in topology.switches:
        row = per_tier.setdefault(tiers[s.guid], {"switches": 0, "sharp": 0, "down": 0.0, "up": 0.0, "same": 0})
        row["switches"] += 1
        row["sharp"] += int(s.sharp)
    rates: dict[tuple[int, str], list[int]] = {}
    states: Counter[str] = Counter()
    for link in topology.links:
        states[link.state] += 1
        a, b = link.a.guid, link.b.guid
        host_link = (a in switches and b in cas) or (b in switches and a in cas)
        switch_link = a in switches and b in switches
        counts = rates.setdefault((link.width, link.speed), [0, 0, 0])
        counts[0] += 1
        counts[1] += int(host_link)
        counts[2] += int(switch_link)
        if link.state == "down":
            continue
        gbps = link.gbps
        if host_link:
            per_tier[tiers[a if a in switches else b]]["down"] += gbps
        elif switch_link and a != b:
            ta, tb = tiers[a], tiers[b]
            if ta == tb:
                per_tier[ta]["same"] += 1
            elif ta and tb:
                lo, hi = min(ta, tb), max(ta, tb)
                per_tier[lo]["up"] += gbps
                per_tier[hi]["down"] += gbps
    tier_rows = []
    for t in sorted(per_tier, key=lambda k: (k == 0, k)):
        row = per_tier[t]
        ratio = row["down"] / row["up"] if row["up"] else None
        tier_rows.append(
            TierSummary(
                tier=t,
                switches=int(row["switches"]),
                sharp=int(row["sharp"]),
                down_gbps=row["down"],
                up_gbps=row["up"],
                oversubscription=ratio,
                same_tier_links=int(row["same"]),
            )
        )

    # Rails as the adapters carry them (`Ca.rail`); a host whose cabled adapters have none (one
    # adapter, no rail) is counted apart, not as rail 0.
    cabled = {guid for guid, switches in index.graph.ca_switches.items() if switches}
    host_rails: dict[str, set[int]] = {h.name: set() for h in topology.hosts}
    unrailed: set[str] = set()
    for ca in topology.cas:
        if ca.guid in cabled:
            if ca.rail is None:
                unrailed.add(ca.host)
            else:
                host_rails[ca.host].add(ca.rail)
    rail_hosts: Counter[int] = Counter(r for rails in host_rails.values() for r in rails)
    rail_counts: Counter[int] = Counter(len(rails) for h, rails in host_rails.items() if rails)
    gpu_models: Counter[str] = Counter(g.model for h in topology.hosts for g in h.gpus)

    bisection: float | None = None
    bisection_hosts = 0
    if index.levels:
        biggest = max(index.subtrees(index.levels), key=lambda t: len(t.hosts), default=None)
        if biggest is not None:
            bisection, bisection_hosts = index.bisection_gbps(biggest), len(biggest.hosts)
    sharp_subtrees = index.sharp_subtrees()

    return Summary(
        name=topology.name,
        file=file,
        format=fmt,
        content_hash=content_hash(topology),
        hosts=len(topology.hosts),
        cas=len(topology.cas),
        gpus=sum(gpu_models.values()),
        gpu_models=dict(sorted(gpu_models.items())),
        switches=len(topology.switches),
        routers=len(topology.routers),
        links=len(topology.links),
        links_by_state=dict(sorted(states.items())),
        levels=index.levels,
        leaf_groups=len(build_hierarchy(topology).leaf_units()),
        tree_like=index.tree_like,
        tiers=tier_rows,
        rails=[RailSummary(rail=r, hosts=n) for r, n in sorted(rail_hosts.items())],
        hosts_by_rail_count=[RailCountSummary(rails=r, hosts=n) for r, n in sorted(rail_counts.items())],
        hosts_without_rail=len(unrailed),
        link_rates=[
            RateSummary(rate=f"{w}x{s}", gbps=w * LANE_GBPS[s], links=c[0], host_links=c[1], switch_links=c[2])
            for (w, s), c in sorted(rates.items(), key=lambda kv: (-kv[0][0] * LANE_GBPS[kv[0][1]], kv[0]))
        ],
        sharp_switches=sum(1 for s in topology.switches if s.sharp),
        largest_sharp_subtree_hosts=len(sharp_subtrees[0].hosts) if sharp_subtrees else 0,
        bisection_gbps=bisection,
        bisection_hosts=bisection_hosts,
        warnings=list(topology.warnings),
    )


def _compact(names: Sequence[str]) -> str:
    """A hostlist expression when it is much shorter than the names joined by commas (spine[01-16])."""
    joined = ",".join(sorted(names))
    compressed = compress_hostlist(names) if names else ""
    return compressed if len(compressed) <= 0.75 * len(joined) else joined


def switch_trees(topology: Topology) -> tuple[list[TreeUnit], list[str]]:
    """The trees the tree-shaped exports are cut from (`build_hierarchy`: one per part of the
    fabric that links join; none when no host is cabled), top-down, and their warnings."""
    hierarchy = build_hierarchy(topology)
    names = {s.guid: s.name for s in topology.switches}

    first_host: dict[str, str] = {}

    def first(name: str) -> str:
        if name not in first_host:
            u = hierarchy.units[name]
            first_host[name] = min([*u.hosts, *(first(c) for c in u.children)], default="")
        return first_host[name]

    def unit(name: str) -> TreeUnit:
        u = hierarchy.units[name]
        switch_names = [names.get(g, g) for g in u.switches]
        return TreeUnit(
            name=u.name,
            tier=u.tier,
            switches=_compact(switch_names),
            hosts=compress_hostlist(u.hosts) if u.hosts else "",
            host_count=len(u.hosts),
            children=[unit(c) for c in sorted(u.children, key=lambda c: (first(c), c))],
        )

    return [unit(r) for r in hierarchy.roots], list(hierarchy.warnings)


def _gbps(value: float) -> str:
    text = f"{value:,.2f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    spans: list[list[int]] = []
    for n in sorted(numbers):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def _rails_text(summary: Summary) -> str:
    """`8 (rails 0-7: 127 hosts each)`, or rails grouped by their host count."""
    apart = f"{summary.hosts_without_rail} host(s) with one adapter and no rail"
    if not summary.rails:
        return f"none ({apart})" if summary.hosts_without_rail else "none (no host has a cabled adapter)"
    by_count: dict[int, list[int]] = {}
    for r in summary.rails:
        by_count.setdefault(r.hosts, []).append(r.rail)
    parts = []
    for hosts, rails in sorted(by_count.items(), key=lambda kv: (-len(kv[1]), kv[1])):
        label = f"rail{'s' if len(rails) > 1 else ''} {_ranges(rails)}"
        each = " each" if len(rails) > 1 else ""
        parts.append(f"{label}: {hosts} host{'' if hosts == 1 else 's'}{each}")
    if summary.hosts_without_rail:
        parts.append(apart)
    return f"{len(summary.rails)} ({'; '.join(parts)})"


def render_summary(console: Console, summary: Summary) -> None:
    overview = Table(title=f"fabric {summary.name}", show_header=False, title_justify="left", box=None)
    overview.add_column(style="bold")
    overview.add_column(overflow="fold")

    def row(key: str, value: str) -> None:
        overview.add_row(key, Text(value))

    row("source", f"{summary.file} ({summary.format})")
    row("hosts", f"{summary.hosts}")
    row("adapters", f"{summary.cas}")
    if summary.gpus:
        models = ", ".join(f"{n} x {m}" for m, n in summary.gpu_models.items())
        row("GPUs", f"{summary.gpus} ({models})")
    tiers = ", ".join(f"tier {t.tier}: {t.switches}" for t in summary.tiers)
    row("switches", f"{summary.switches}" + (f" ({tiers})" if tiers else ""))
    if summary.routers:
        row("routers", f"{summary.routers}")
    not_up = ", ".join(f"{n} {s}" for s, n in summary.links_by_state.items() if s != "up")
    row("links", f"{summary.links}" + (f" ({not_up})" if not_up else ""))
    row("levels", f"{summary.levels}" + ("" if summary.tree_like else " (not tree-like: same-tier links)"))
    row("leaf groups", f"{summary.leaf_groups}")
    row("rails", _rails_text(summary))
    if summary.hosts_by_rail_count:
        counts = (f"{c.hosts} with {c.rails} rail{'' if c.rails == 1 else 's'}" for c in summary.hosts_by_rail_count)
        row("rail counts", ", ".join(counts))
    sharp = f"{summary.sharp_switches}"
    if summary.largest_sharp_subtree_hosts:
        sharp += f" (largest all-SHARP subtree: {summary.largest_sharp_subtree_hosts} hosts)"
    row("SHARP", sharp)
    if summary.bisection_gbps is not None:
        row("bisection", f"{_gbps(summary.bisection_gbps)} Gb/s (top subtree of {summary.bisection_hosts} hosts)")
    elif summary.bisection_hosts:
        row("bisection", "n/a (not tree-like)")
    row("hash", summary.content_hash)
    console.print(overview)

    if summary.tiers:
        table = Table(title="tiers (capacity in Gb/s; down = towards hosts)", title_justify="left")
        for name in ("tier", "switches", "SHARP", "down", "up", "down:up", "same tier"):
            table.add_column(name, justify="right")
        for t in reversed(summary.tiers):
            ratio = "-" if t.oversubscription is None else f"{t.oversubscription:.2f}:1"
            tier = "unattached" if t.tier == 0 else f"{t.tier}" + (" leaf" if t.tier == 1 else "")
            table.add_row(
                tier, f"{t.switches}", f"{t.sharp}", _gbps(t.down_gbps), _gbps(t.up_gbps), ratio, f"{t.same_tier_links}"
            )
        console.print(table)
    if summary.link_rates:
        table = Table(title="link speeds", title_justify="left")
        for name in ("width x speed", "Gb/s", "links", "host links", "switch links"):
            table.add_column(name, justify="right")
        for r in summary.link_rates:
            table.add_row(r.rate, _gbps(r.gbps), f"{r.links}", f"{r.host_links}", f"{r.switch_links}")
        console.print(table)
    if summary.warnings:
        console.print(Text(f"warnings ({len(summary.warnings)})", style="bold yellow"))
        for w in summary.warnings[:MAX_WARNINGS_SHOWN]:
            console.print(Text(f"  {w}"), soft_wrap=True)
        if len(summary.warnings) > MAX_WARNINGS_SHOWN:
            more = len(summary.warnings) - MAX_WARNINGS_SHOWN
            console.print(Text(f"  ... and {more} more (--format json lists them all)"), soft_wrap=True)
    else:
        console.print(Text("warnings: none"))


def render_trees(console: Console, units: list[TreeUnit], warnings: list[str]) -> None:
    if not units:
        console.print(Text("tree: no host is cabled to a switch"))
    for unit in units:

        def label(u: TreeUnit) -> Text:
            text = Text(u.name, style="bold")
            detail = f"  tier {u.tier}"
            if u.switches and u.switches != u.name:
                detail += f", switches {u.switches}"
            text.append(detail)
            if u.hosts:
                text.append(f"  hosts ({u.host_count}): {u.hosts}", style="green")
            return text

        def add(node: Tree, u: TreeUnit) -> None:
            for child in u.children:
                add(node.add(label(child)), child)

        root = Tree(label(unit))
        add(root, unit)
        console.print(root)
    for w in warnings:
        console.print(Text(f"tree warning: {w}"), soft_wrap=True)


def cmd_show(args: argparse.Namespace) -> int:
    topology, kind = load(args.file, args.from_format, args.names, args.rails)
    summary = summarize(topology, file=_display(args.file), fmt=kind)
    trees, tree_warnings = switch_trees(topology) if args.tree else ([], [])
    if args.format == "json":
        summary.trees = trees
        if tree_warnings:
            summary.warnings = [*summary.warnings, *tree_warnings]
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(summary).decode(), indent=2) + "\n")
        return EXIT_OK
    console = Console(file=sys.stdout, highlight=False)
    render_summary(console, summary)
    if args.tree:
        render_trees(console, trees, tree_warnings)
    return EXIT_OK


# ------------------------------------------------------------------------------------------ diff


def _names(topology: Topology) -> dict[str, str]:
    """GUID -> a readable name: switch and router names, `host/ca` for adapters."""
    out = {s.guid: s.name for s in topology.switches}
    out.update({r.guid: r.name for r in topology.routers})
    out.update({c.guid: f"{c.host}/{c.name or c.guid}" for c in topology.cas})
    return out


def _link_text(link: Link, names: dict[str, str]) -> str:
    lo, hi = link.ends
    extra = "" if link.state == "up" else f" {link.state}"
    a, b = names.get(lo.guid, lo.guid), names.get(hi.guid, hi.guid)
    return f"{a}:{lo.port} - {b}:{hi.port}  {link.width}x{link.speed}{extra}"


def _changes(old: msgspec.Struct, new: msgspec.Struct, fields: Sequence[str]) -> str:
    parts = []
    for f in fields:
        a, b = getattr(old, f), getattr(new, f)
        if a != b:
            parts.append(f"{f} {a} -> {b}")
    return ", ".join(parts)


def _host_changes(old: Topology, new: Topology, host: str) -> str:
    def view(t: Topology) -> tuple[dict[str, Any], list[Any]]:
        cas = {c.name or c.guid: c for c in t.cas if c.host == host}
        gpus = next(h.gpus for h in t.hosts if h.name == host)
        return cas, gpus

    (ca_old, gpu_old), (ca_new, gpu_new) = view(old), view(new)
    parts = []
    if gpu_old != gpu_new:
        parts.append(f"gpus {_gpu_text(gpu_old)} -> {_gpu_text(gpu_new)}")
    for name in sorted(ca_new.keys() - ca_old.keys()):
        parts.append(f"adapter {name} added")
    for name in sorted(ca_old.keys() - ca_new.keys()):
        parts.append(f"adapter {name} removed")
    for name in sorted(ca_old.keys() & ca_new.keys()):
        change = _changes(ca_old[name], ca_new[name], ("guid", "ports", "rail"))
        if change:
            parts.append(f"adapter {name}: {change}")
    return "; ".join(parts)


def _gpu_text(gpus: list[Any]) -> str:
    if not gpus:
        return "none"
    models = Counter(g.model for g in gpus)
    return ", ".join(f"{n} x {m}" for m, n in sorted(models.items()))


def render_diff(old: Topology, new: Topology, d: TopologyDiff) -> list[str]:
    lines: list[str] = []
    old_sw, new_sw = {s.guid: s for s in old.switches}, {s.guid: s for s in new.switches}
    old_ln, new_ln = {ln.link_id: ln for ln in old.links}, {ln.link_id: ln for ln in new.links}
    old_names, new_names = _names(old), _names(new)

    def section(title: str, items: list[str], render: Any) -> None:
        if items:
            lines.append(f"{title} ({len(items)}):")
            lines.extend(f"  {render(i)}" for i in items)

    if d.hosts_added:
        lines.append(f"hosts added ({len(d.hosts_added)}): {compress_hostlist(d.hosts_added)}")
    if d.hosts_removed:
        lines.append(f"hosts removed ({len(d.hosts_removed)}): {compress_hostlist(d.hosts_removed)}")
    section("hosts changed", d.hosts_changed, lambda h: f"{h}: {_host_changes(old, new, h)}")
    section("switches added", d.switches_added, lambda g: f"{new_sw[g].name} ({g}, {new_sw[g].radix} ports)")
    section("switches removed", d.switches_removed, lambda g: f"{old_sw[g].name} ({g}, {old_sw[g].radix} ports)")
    section(
        "switches changed",
        d.switches_changed,
        lambda g: f"{new_sw[g].name} ({g}): " + _changes(old_sw[g], new_sw[g], ("name", "radix", "sharp", "model")),
    )
    section("links added", d.links_added, lambda i: _link_text(new_ln[i], new_names))
    section("links removed", d.links_removed, lambda i: _link_text(old_ln[i], old_names))
    section(
        "links changed",
        d.links_changed,
        lambda i: (
            _link_text(old_ln[i], old_names)
            + "  ->  "
            + _changes(old_ln[i], new_ln[i], ("width", "speed", "state", "media"))
        ),
    )
    return lines


class DiffReport(msgspec.Struct, kw_only=True):
    old: str
    new: str
    old_hash: str
    new_hash: str
    same: bool
    diff: TopologyDiff


def cmd_diff(args: argparse.Namespace) -> int:
    if args.old == STDIN and args.new == STDIN:
        raise UsageError("only one of OLD and NEW can be '-' (stdin)")
    old, _ = load(args.old, args.from_old, args.names_old)
    new, _ = load(args.new, args.from_new, args.names_new)
    d = diff(old, new)
    old_hash, new_hash = content_hash(old), content_hash(new)
    if args.format == "json":
        report = DiffReport(
            old=_display(args.old), new=_display(args.new), old_hash=old_hash, new_hash=new_hash, same=d.empty, diff=d
        )
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(report).decode(), indent=2) + "\n")
        return EXIT_OK
    for mark, path, t, h in (("---", args.old, old, old_hash), ("+++", args.new, new, new_hash)):
        size = f"{len(t.hosts)} hosts, {len(t.switches)} switches, {len(t.links)} links"
        print(f"{mark} {_display(path)}  ({size}, sha256 {h[:12]})")
    if d.empty:
        same = old_hash == new_hash
        print("no differences" + ("" if same else " in hosts, switches or links (the name or routers differ)"))
        return EXIT_OK
    for line in render_diff(old, new, d):
        print(line)
    counts = [
        ("hosts", d.hosts_added, d.hosts_removed, d.hosts_changed),
        ("switches", d.switches_added, d.switches_removed, d.switches_changed),
        ("links", d.links_added, d.links_removed, d.links_changed),
    ]
    print("summary: " + "; ".join(f"{name} +{len(a)} -{len(r)} ~{len(c)}" for name, a, r, c in counts if a or r or c))
    return EXIT_OK


# -------------------------------------------------------------------------------------- generate


def _convert_value(raw: str) -> int | float | bool | str:
    lowered = raw.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    for convert in (int, float):
        try:
            return convert(raw)
        except ValueError:
            continue
    return raw


def generator_params(kind: str) -> list[inspect.Parameter]:
    return list(inspect.signature(GENERATORS[kind]).parameters.values())


def _param_text(p: inspect.Parameter) -> str:
    if p.default is inspect.Parameter.empty:
        return f"{p.name}=<required>"
    default = "" if p.default is None else str(p.default)
    return f"{p.name}={default!r}" if " " in default else f"{p.name}={default}"


def parse_params(kind: str, items: Sequence[str]) -> dict[str, Any]:
    """`hosts=127 radix=64` -> kwargs for GENERATORS[kind] (numbers and true/false converted).
    UsageError for an item that is not key=value, an unknown or repeated key, a missing required one."""
    params = {p.name: p for p in generator_params(kind)}
    known = ", ".join(_param_text(p) for p in params.values())
    kwargs: dict[str, Any] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key:
            raise UsageError(f"generator parameter {item!r} is not key=value; {kind} takes: {known}")
        if key not in params:
            raise UsageError(f"{kind} has no parameter {key!r}; it takes: {known}")
        if key in kwargs:
            raise UsageError(f"parameter {key!r} given twice")
        kwargs[key] = raw if key in ("name", "gpu_model", "speed") else _convert_value(raw)
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in kwargs]
    if missing:
        raise UsageError(f"{kind} needs {', '.join(f'{m}=' for m in missing)}; it takes: {known}")
    return kwargs


def cmd_generate(args: argparse.Namespace) -> int:
    kwargs = parse_params(args.kind, args.params)
    try:
        topology = GENERATORS[args.kind](**kwargs)
    except (ValueError, TypeError, FabricError) as e:
        given = " ".join(args.params)
        raise InputError(f"{args.kind}{' ' + given if given else ''}: {e}") from None
    if args.to is None:
        yaml_out = bool(args.output) and Path(args.output).suffix.lower() in (".yaml", ".yml")
        args.to = "native-yaml" if yaml_out else "native"
    exported = export_topology(args.to, topology)
    _warn(exported.warnings)
    _write(args.output, exported.text)
    tiers = Counter(FabricIndex(topology).tiers.values())
    per_tier = ", ".join(f"tier {t}: {n}" for t, n in sorted(tiers.items()))
    target = args.output if args.output and args.output != STDIN else "stdout"
    print(
        f"generated {topology.name}: {len(topology.hosts)} hosts, {len(topology.cas)} adapters, "
        f"{len(topology.switches)} switches ({per_tier}), {len(topology.links)} links"
        f" -> {target} ({args.to}), sha256 {content_hash(topology)[:16]}",
        file=sys.stderr,
    )
    return EXIT_OK


# ---------------------------------------------------------------------------------------- parser

_CONVERT_EXAMPLES = """\
examples:
  ibpool topo convert --from ibnetdiscover X5.topofile --names X5.map --to slurm -o topology.conf
  ibnetdiscover | ibpool topo convert --from ibnetdiscover - --to k8s-labels
  ibpool topo convert fabric.json --to volcano --nodes 'dgx[001-064]'
  ibpool topo convert --from slurm topology.conf --to native-yaml

FILE '-' reads stdin. Without --from the format is guessed: native (.json/.yaml, a
'format: ibpool.topology' document, or a bare topology as the fabric monitor's GET /v1/topology
serves it), Volcano HyperNodes, Kubernetes Nodes, Slurm (SwitchName= / BlockName= lines,
topology.yaml), else ibnetdiscover. The output goes to stdout without -o;
warnings ("FILE:LINE: message") go to stderr. --names (a GUID -> name map: 'H-0002c90300080e84
node01' lines) applies to ibnetdiscover input. --nodes keeps only the given hosts.
exit codes: 0 ok, 1 usage error, 2 input error (the message names FILE:LINE and the reason)."""

_SHOW_EXAMPLES = """\
examples:
  ibpool topo show X5.topofile --names X5.map
  ibpool topo show superpod.json --tree
  ibpool topo show topology.conf --format json | jq .tiers

The summary: hosts, adapters, GPUs, switches per tier (tiers computed from the graph, 1 = leaf),
links per width x speed, rails (hosts with an adapter on each rail), downlink and uplink capacity
and oversubscription per tier, SHARP-capable switches, bisection bandwidth of the top subtree,
the content hash and the import warnings. --tree adds the tree the Slurm / Kubernetes / Volcano
exports are cut from, top-down, with the hosts of each leaf group hostlist-compressed.
exit codes: 0 ok, 1 usage error, 2 input error."""

_DIFF_EXAMPLES = """\
examples:
  ibpool topo diff fabric-v1.json fabric-v2.json
  ibpool topo diff --from-old ibnetdiscover yesterday.topo today.topo --format json

Hosts are compared by name, switches by GUID, links by their two ports (GUID:port). Formats
without GUIDs (Slurm, labels, HyperNodes) get GUIDs made from names, so compare files of the
same format. Prints "no differences" when there are none.
exit codes: 0 whether or not they differ, 1 usage error, 2 input error."""


def _generate_epilog() -> str:
    lines = ["generators and their parameters (key=value; numbers, true/false):"]
    for kind, fn in GENERATORS.items():
        doc = (inspect.getdoc(fn) or "").split("\n\n", 1)[0].replace("\n", " ")
        lines.append(f"  {kind}")
        line = "   "
        for param in (_param_text(p) for p in generator_params(kind)):
            if len(line) + 1 + len(param) > 96:
                lines.append(line)
                line = "   "
            line += " " + param
        lines.append(line)
        if doc:
            lines.extend(textwrap.wrap(doc, width=96, initial_indent="      ", subsequent_indent="      "))
    lines += [
        "",
        "examples:",
        "  ibpool topo generate rail_optimised hosts=127 -o superpod.json      # DGX SuperPOD, 4 SUs",
        "  ibpool topo generate fat_tree_2tier hosts=512 radix=64 oversubscription=3 --to slurm",
        "  ibpool topo generate torus_3d x=4 y=4 z=4 -o torus.yaml                # native YAML",
        "",
        "A one-line summary goes to stderr. exit codes: 0 ok, 1 usage error (unknown or missing",
        "parameter), 2 input error (parameters the generator rejects, e.g. too many hosts for the radix).",
    ]
    return "\n".join(lines)


_IN = ", ".join(IMPORT_FORMATS)
_OUT = ", ".join(EXPORT_FORMATS)


def build_parser() -> _Parser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = _Parser(
        prog=PROG,
        description="Fabric topologies: convert between formats, summarize, diff, generate.",
        formatter_class=fmt,
        epilog="exit codes: 0 ok, 1 usage error, 2 input error.\n'ibpool topo COMMAND --help' shows examples.",
    )
    sub = p.add_subparsers(dest="topo_command", required=True, metavar="COMMAND")

    c = sub.add_parser("convert", help="read one format, write another", formatter_class=fmt, epilog=_CONVERT_EXAMPLES)
    c.add_argument(
        "--from",
        dest="from_format",
        choices=IMPORT_FORMATS,
        metavar="FORMAT",
        help=f"input format: {_IN} (default: guessed)",
    )
    c.add_argument("file", metavar="FILE", help="input file, '-' for stdin")
    c.add_argument("--to", required=True, choices=EXPORT_FORMATS, metavar="FORMAT", help=f"output format: {_OUT}")
    c.add_argument("--names", metavar="MAPFILE", help="GUID -> host name map (ibnetdiscover input)")
    c.add_argument(
        "--rails",
        metavar="NAMES",
        help="adapter names in rail order (ibnetdiscover input), e.g. mlx5_0,mlx5_3,mlx5_4; "
        "default: the number in each adapter's name (mlx5_N: rail N, HCA-N: rail N-1)",
    )
    c.add_argument("--nodes", metavar="HOSTLIST", help="only these hosts, e.g. 'gpu[001-032,040]'")
    c.add_argument("-o", "--output", metavar="OUT", help="output file (default: stdout)")
    c.add_argument("-q", "--quiet", action="store_true", help="no warnings on stderr")
    c.set_defaults(handler=cmd_convert)

    s = sub.add_parser(
        "show",
        help="summary of a topology (tiers, rails, speeds, oversubscription)",
        formatter_class=fmt,
        epilog=_SHOW_EXAMPLES,
    )
    s.add_argument("file", metavar="FILE", help="input file, '-' for stdin")
    s.add_argument(
        "--from",
        dest="from_format",
        choices=IMPORT_FORMATS,
        metavar="FORMAT",
        help=f"input format: {_IN} (default: guessed)",
    )
    s.add_argument("--names", metavar="MAPFILE", help="GUID -> host name map (ibnetdiscover input)")
    s.add_argument(
        "--rails",
        metavar="NAMES",
        help="adapter names in rail order (ibnetdiscover input), e.g. mlx5_0,mlx5_3,mlx5_4; "
        "default: the number in each adapter's name (mlx5_N: rail N, HCA-N: rail N-1)",
    )
    s.add_argument("--tree", action="store_true", help="also print the switch tree, top-down")
    s.add_argument("--format", choices=("table", "json"), default="table", help="output (default: table)")
    s.set_defaults(handler=cmd_show)

    d = sub.add_parser("diff", help="what changed between two topologies", formatter_class=fmt, epilog=_DIFF_EXAMPLES)
    d.add_argument("old", metavar="OLD", help="the earlier topology, any input format, '-' for stdin")
    d.add_argument("new", metavar="NEW", help="the later topology")
    d.add_argument("--from-old", choices=IMPORT_FORMATS, metavar="FORMAT", help="format of OLD (default: guessed)")
    d.add_argument("--from-new", choices=IMPORT_FORMATS, metavar="FORMAT", help="format of NEW (default: guessed)")
    d.add_argument("--names-old", metavar="MAPFILE", help="name map for OLD (ibnetdiscover)")
    d.add_argument("--names-new", metavar="MAPFILE", help="name map for NEW (ibnetdiscover)")
    d.add_argument("--format", choices=("text", "json"), default="text", help="output (default: text)")
    d.set_defaults(handler=cmd_diff)

    g = sub.add_parser(
        "generate",
        help="a generated fabric (fat-tree, SuperPOD, torus, dragonfly)",
        formatter_class=fmt,
        epilog=_generate_epilog(),
    )
    g.add_argument(
        "kind",
        metavar="KIND",
        type=lambda k: k.replace("-", "_"),
        choices=list(GENERATORS),
        help=f"one of: {', '.join(GENERATORS)}",
    )
    g.add_argument("params", nargs="*", default=[], metavar="KEY=VALUE", help="generator parameters, e.g. hosts=127")
    g.add_argument("-o", "--output", metavar="FILE", help="output file (default: stdout)")
    g.add_argument(
        "--to",
        choices=EXPORT_FORMATS,
        metavar="FORMAT",
        help=f"output format: {_OUT} (default: native, native-yaml for a .yaml/.yml FILE)",
    )
    g.set_defaults(handler=cmd_generate)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`ibpool topo ...` (argv without the leading 'topo'); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[2:] if argv is None else argv))
    except SystemExit as e:  # --help (0) or a usage error (1)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    command = f"{PROG} {args.topo_command}"
    try:
        code: int = args.handler(args)
        return code
    except UsageError as e:
        print(f"{command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except InputError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_INPUT
    except (FabricError, ValueError) as e:  # from the model or an exporter: still about the input
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_INPUT
    except BrokenPipeError:  # `ibpool topo convert ... | head`
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if os.environ.get("IBPOOL_DEBUG") == "1":
            raise
        print(f"{PROG}: internal error ({type(e).__name__}: {e}); IBPOOL_DEBUG=1 shows the traceback", file=sys.stderr)
        return EXIT_INPUT
