"""The one tree every tree-shaped export is cut from (Slurm tree and block, Kubernetes labels, Volcano).

A fabric is rarely a tree: a fat tree gives every leaf several spines. The exports need one, so:

1. Leaf groups (`host_groups`, also what `ibpool topo show` counts): the connected components of
   the graph of hosts and the leaf switches their adapters are cabled to (links between switches
   do not join groups). A single-rail host's group is its leaf switch; a rail-optimised host (one
   HCA per rail, each on another leaf) joins the leaves of its scalable unit, also when one of its
   adapters is missing. Each host is in exactly one group.
2. Upwards, tier by tier (tiers from `Graph.tiers()`): groups joined through switches of the next
   tier merge into one unit (connected components of "unit - upper switch" links). A unit whose
   upper switches reach no other unit just rises (no one-child chains). Units that reach no higher
   switch are finished.
3. What is left at the top: units whose switches are joined by links (a torus, a dragonfly, leaves
   cabled to each other) hang under a made-up `root`; parts of the fabric that no link joins stay
   apart, each with its own top (as Slurm allows; it then places no job across them), and a
   warning names them.

When the switch graph is itself a tree (a Slurm topology.conf read back, a tree-shaped fabric) and
each link between switches points from child (`a`) to parent (`b`) consistently, that tree is taken
as it is, so Slurm tree -> model -> Slurm tree gives the same file (up to ordering).

Unit names are the switch names where a unit stands for one switch, otherwise made up from a hash
of the member switch GUIDs (`leafgroup-1a2b3c4d`, `tier2group-...`), stable across runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from ..graph import Graph
from ..model import Ca, FabricError, Host, Link, PortRef, Switch, Topology, build_topology, unnamed_host
from .diagnostics import FormatError, synthetic_guid, where

__all__ = [
    "Hierarchy",
    "TreeEntry",
    "Unit",
    "build_hierarchy",
    "check_tree",
    "host_groups",
    "leaf_groups",
    "nothing_to_export",
    "subset_topology",
    "topology_from_tree",
    "unique_names",
]


@dataclass(frozen=True)
class Unit:
    """One switch of the exported tree: a real switch or a group of them."""

    name: str
    tier: int  # 1 for leaf groups; a parent is one above its highest child
    children: tuple[str, ...] = ()  # child unit names
    hosts: tuple[str, ...] = ()  # host names (leaf groups only)
    leaves: tuple[str, ...] = ()  # the leaf switch GUIDs of a leaf group
    switches: tuple[str, ...] = ()  # GUIDs of the real switches the unit stands for


@dataclass(frozen=True)
class Hierarchy:
    roots: tuple[str, ...]  # the tops, by name: one per part of the fabric; none when no host is cabled
    units: dict[str, Unit]
    warnings: tuple[str, ...] = ()

    def walk(self) -> list[str]:
        """Unit names in depth-first pre-order from the roots (by name), children by name."""
        out: list[str] = []
        stack = sorted(self.roots, reverse=True)
        while stack:
            name = stack.pop()
            out.append(name)
            stack.extend(sorted(self.units[name].children, reverse=True))
        return out

    def leaf_units(self) -> list[Unit]:
        """The leaf groups in tree order (siblings next to each other)."""
        return [self.units[n] for n in self.walk() if self.units[n].hosts]

    def parents(self) -> dict[str, str]:
        return {c: u.name for u in self.units.values() for c in u.children}

    def depths(self) -> dict[str, int]:
        """Unit name -> distance from its root (a root = 0)."""
        parents = self.parents()
        depth: dict[str, int] = {}
        for name in self.walk():  # parents come before their children
            depth[name] = depth[parents[name]] + 1 if name in parents else 0
        return depth


def leaf_groups(hierarchy: Hierarchy) -> set[frozenset[str]]:
    """The host sets of the leaf groups: what every round trip must keep."""
    return {frozenset(u.hosts) for u in hierarchy.units.values() if u.hosts}


def nothing_to_export(hierarchy: Hierarchy) -> str:
    """Why a hierarchy has no leaf group, for the error of an export that needs one."""
    unnamed = next((w for w in hierarchy.warnings if "only by an adapter's GUID" in w), None)
    if unnamed:
        return (
            f"nothing to export: no named host is cabled to a switch ({unnamed}; a GUID -> name map, "
            "--names MAPFILE, names them)"
        )
    return "nothing to export: no host of the topology is cabled to a switch"


def host_groups(host_leaves: Mapping[str, Sequence[str]]) -> dict[frozenset[str], list[str]]:
    """The leaf groups: leaf switch GUIDs -> the hosts of the group, from host -> the leaves its
    adapters are cabled to. A group is a connected component of hosts and leaves (a host joins every
    leaf it is cabled to); hosts cabled to no leaf are in none."""
    uf = _UnionFind()
    for leaves in host_leaves.values():
        for leaf in leaves:
            uf.union(leaves[0], leaf)
    leaves_of: dict[str, set[str]] = {}
    hosts_of: dict[str, list[str]] = {}
    for host, leaves in host_leaves.items():
        if leaves:
            key = uf.find(leaves[0])
            leaves_of.setdefault(key, set()).update(leaves)
            hosts_of.setdefault(key, []).append(host)
    return {frozenset(leaves_of[k]): hosts_of[k] for k in leaves_of}


def unique_names(names: Iterable[str], sanitize: Callable[[str], str] | None = None) -> dict[str, str]:
    """Map each name to a distinct cleaned one (`sanitize(name)`; a suffix -2, -3... on clashes)."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for name in names:
        base = sanitize(name) if sanitize else name
        candidate, n = base, 2
        while candidate in used:
            candidate = f"{base}-{n}"
            n += 1
        used.add(candidate)
        out[name] = candidate
    return out


def _digest(guids: Iterable[str]) -> str:
    return hashlib.sha256(",".join(sorted(guids)).encode()).hexdigest()


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _switch_tree(topology: Topology, graph: Graph, selected_leaves: set[str]) -> dict[str, str | None] | None:
    """switch GUID -> parent GUID when the cabling is a tree oriented child (a) -> parent (b); else None.

    Only the switches on the way up from `selected_leaves` are kept.
    """
    parent: dict[str, str] = {}
    for link in topology.links:
        a, b = link.a.guid, link.b.guid
        if a == b or a not in graph.switches or b not in graph.switches:
            continue
        if parent.get(a, b) != b:
            return None  # two parents
        parent[a] = b
    host_leaves = set(graph.leaves())

    def chain(leaf: str) -> list[str] | None:
        out: list[str] = []
        node: str | None = leaf
        while node is not None:
            if node in out:
                return None  # a cycle
            out.append(node)
            node = parent.get(node)
        return out

    above: set[str] = set()
    for leaf in host_leaves:
        path = chain(leaf)
        if path is None:
            return None
        if any(p in host_leaves for p in path[1:]):
            return None  # a switch with both hosts and child switches: Slurm has no such thing
        above.update(path)
    for link in topology.links:  # no cross links between the switches of the tree
        a, b = link.a.guid, link.b.guid
        if a in above and b in above and a != b and parent.get(a) != b:
            return None
    kept: set[str] = set()
    for leaf in selected_leaves:
        kept.update(chain(leaf) or ())
    return {g: parent.get(g) for g in kept}


def build_hierarchy(topology: Topology, *, nodes: Collection[str] | None = None) -> Hierarchy:
    """The tree of leaf groups and upper units for `topology` (only `nodes`, when given). Hosts named
    only by an adapter's GUID (`model.unnamed_host`) are left out, with one warning."""
    graph = Graph(topology)
    warnings: list[str] = []
    switch_names = _switch_names(topology, warnings)
    host_leaves = graph.host_leaves()
    if nodes is not None:
        wanted = set(nodes)
        unknown = sorted(wanted - host_leaves.keys())
        if unknown:
            warnings.append(f"{len(unknown)} selected node(s) are not in the topology: {', '.join(unknown[:10])}")
        host_leaves = {h: ls for h, ls in host_leaves.items() if h in wanted}
    unnamed = sorted(h for h in host_leaves if unnamed_host(h))
    if unnamed:
        warnings.append(
            f"{len(unnamed)} host(s) named only by an adapter's GUID ({unnamed[0]}...) are left out: "
            "no Slurm, Kubernetes or Volcano node has such a name"
        )
        host_leaves = {h: ls for h, ls in host_leaves.items() if not unnamed_host(h)}
    unplaced = sorted(h for h, ls in host_leaves.items() if not ls)
    if unplaced:
        warnings.append(f"{len(unplaced)} host(s) are cabled to no switch and left out: {', '.join(unplaced[:10])}")
    groups = host_groups(host_leaves)
    if not groups:
        return Hierarchy(roots=(), units={}, warnings=tuple(warnings))
    used_names = set(switch_names.values())

    def made_up(prefix: str, guids: Iterable[str]) -> str:
        return _made_up(prefix, guids, used_names)

    units: dict[str, Unit] = {}
    single = all(len(k) == 1 for k in groups)
    tree = _switch_tree(topology, graph, {next(iter(k)) for k in groups}) if single else None
    if tree is not None:
        hosts_of = {next(iter(k)): tuple(sorted(hs)) for k, hs in groups.items()}
        kids: dict[str, list[str]] = {g: [] for g in tree}
        for guid, parent in tree.items():
            if parent is not None:
                kids[parent].append(guid)
        height: dict[str, int] = {}

        def unit_of(guid: str) -> int:
            h = 1 + max((unit_of(c) for c in kids[guid]), default=0)
            height[guid] = h
            units[switch_names[guid]] = Unit(
                name=switch_names[guid],
                tier=h,
                children=tuple(sorted(switch_names[c] for c in kids[guid])),
                hosts=hosts_of.get(guid, ()),
                leaves=(guid,) if guid in hosts_of else (),
                switches=(guid,),
            )
            return h

        tops = sorted((g for g, p in tree.items() if p is None), key=lambda g: switch_names[g])
        for top in tops:
            unit_of(top)
        return _rooted(units, [switch_names[t] for t in tops], graph, used_names, warnings)

    tiers = graph.tiers()
    top_of: dict[str, set[str]] = {}
    for leaf_set, members in sorted(groups.items(), key=lambda kv: sorted(kv[1])):
        name = switch_names[next(iter(leaf_set))] if len(leaf_set) == 1 else made_up("leafgroup", leaf_set)
        ordered = tuple(sorted(leaf_set))
        units[name] = Unit(name=name, tier=1, hosts=tuple(sorted(members)), leaves=ordered, switches=ordered)
        top_of[name] = set(leaf_set)
    active = sorted(units)
    finished: list[str] = []
    for k in range(2, max(tiers.values(), default=1) + 1):
        if not active:
            break
        uf = _UnionFind()
        for name in active:
            ups = {n for s in top_of[name] for n in graph.switch_links[s] if tiers[n] == k}
            if not ups:
                finished.append(name)
                continue
            uf.find("u:" + name)
            for n in ups:
                uf.union("u:" + name, "s:" + n)
        components: dict[str, tuple[list[str], set[str]]] = {}
        for key in list(uf.parent):
            component = components.setdefault(uf.find(key), ([], set()))
            if key.startswith("u:"):
                component[0].append(key[2:])
            else:
                component[1].add(key[2:])
        active = []
        for children, switches in components.values():
            if len(children) == 1:
                only = children[0]
                top_of[only] = switches
                units[only] = replace(units[only], switches=tuple(sorted({*units[only].switches, *switches})))
                active.append(only)
                continue
            name = switch_names[next(iter(switches))] if len(switches) == 1 else made_up(f"tier{k}group", switches)
            units[name] = Unit(
                name=name,
                tier=1 + max(units[c].tier for c in children),
                children=tuple(sorted(children)),
                switches=tuple(sorted(switches)),
            )
            top_of[name] = switches
            active.append(name)
        active.sort()
    return _rooted(units, sorted(finished + active), graph, used_names, warnings)


def _made_up(prefix: str, guids: Iterable[str], used: set[str]) -> str:
    """A stable name for a unit of these switches, `<prefix>-<hash>`, not among `used` (then added)."""
    digest = _digest(guids)
    for length in range(8, len(digest) + 1):
        candidate = f"{prefix}-{digest[:length]}"
        if candidate not in used:
            used.add(candidate)
            return candidate
    raise FabricError(f"cannot name a {prefix}")  # pragma: no cover - 2^256 names


def _mesh_groups(members: list[str], units: dict[str, Unit], graph: Graph) -> list[list[str]]:
    """Groups among tops joined by links between them (a dragonfly's groups of routers): two linked
    tops are in one group when their closed neighbourhoods overlap by at least 0.45 (Jaccard). In a
    dragonfly of groups of a routers with h global links each, routers of one group share
    a / (a + 2h) of theirs (0.5 for the usual a = 2h), and a global link's ends 2 / (2a + 2h - 2);
    neighbours in a 3-D torus share 2 / 12. Connected parts of those links, by first member."""
    top_of = {guid: top for top in members for guid in units[top].switches}
    near: dict[str, set[str]] = {top: {top} for top in members}
    for top in members:
        for guid in units[top].switches:
            near[top].update(top_of[n] for n in graph.switch_links.get(guid, ()) if n in top_of)
    uf = _UnionFind()
    for a in members:
        uf.find(a)
        for b in near[a]:
            if a < b and len(near[a] & near[b]) / len(near[a] | near[b]) >= 0.45:
                uf.union(a, b)
    groups: dict[str, list[str]] = {}
    for top in members:
        groups.setdefault(uf.find(top), []).append(top)
    return sorted(sorted(g) for g in groups.values())


def _rooted(units: dict[str, Unit], tops: list[str], graph: Graph, used: set[str], warnings: list[str]) -> Hierarchy:
    """The hierarchy with these tops: tops joined by links between switches share a made-up root,
    through a level of groups where they form some (`_mesh_groups`: a dragonfly's groups); parts of
    the fabric no link joins keep their own tops (with a warning)."""
    uf = _UnionFind()
    for a, neighbours in graph.switch_links.items():
        for b in neighbours:
            uf.union(a, b)
    for top in tops:  # a unit's own switches are one part (a leaf group joined by its hosts)
        for guid in units[top].switches:
            uf.union(units[top].switches[0], guid)
    parts: dict[str, list[str]] = {}
    for top in tops:
        parts.setdefault(uf.find(units[top].switches[0]), []).append(top)
    roots: list[str] = []
    n = 1
    for members in sorted(parts.values()):
        if len(members) == 1:
            roots.append(members[0])
            continue
        groups = _mesh_groups(members, units, graph)
        if 1 < len(groups) < len(members):
            children = []
            for group in groups:
                if len(group) == 1:
                    children.append(group[0])
                    continue
                switches = tuple(sorted(g for top in group for g in units[top].switches))
                unit = _made_up("group", switches, used)
                units[unit] = Unit(
                    name=unit, tier=1 + max(units[t].tier for t in group), children=tuple(group), switches=switches
                )
                children.append(unit)
            members = children
        name = "root"
        while name in used or name in units:
            n += 1
            name = f"root-{n}"
        units[name] = Unit(name=name, tier=1 + max(units[t].tier for t in members), children=tuple(sorted(members)))
        roots.append(name)
    if len(roots) > 1:
        warnings.append(
            f"the fabric is {len(roots)} parts that no link joins (tops {', '.join(sorted(roots)[:6])}"
            f"{', ...' if len(roots) > 6 else ''}): each is a tree of its own, and Slurm places no job across them"
        )
    return Hierarchy(roots=tuple(sorted(roots)), units=units, warnings=tuple(warnings))


def _switch_names(topology: Topology, warnings: list[str]) -> dict[str, str]:
    count: dict[str, int] = {}
    for s in topology.switches:
        count[s.name] = count.get(s.name, 0) + 1
    out: dict[str, str] = {}
    for s in topology.switches:
        if count[s.name] > 1 or not s.name.strip():
            out[s.guid] = f"S-{s.guid.removeprefix('0x')}"
            warnings.append(f"switch name {s.name!r} is not unique; switch {s.guid} is called {out[s.guid]}")
        else:
            out[s.guid] = s.name
    return out


def topology_from_tree(
    *,
    name: str,
    switches: list[str],
    children: dict[str, list[str]],
    nodes: dict[str, list[str]],
    warnings: list[str],
    width: int = 4,
    speed: str = "NDR",
) -> Topology:
    """A Topology for a tree known only by names (Slurm, Kubernetes labels, Volcano HyperNodes).

    GUIDs are made up from the names (stable); each switch's ports are its hosts first, then its
    child switches, then its uplinks; links between switches run child (`a`) -> parent (`b`).
    A host under several switches gets one CA per switch (rails 0, 1, ... in switch order).
    """
    guid = {s: synthetic_guid("switch", s) for s in switches}
    next_port = dict.fromkeys(switches, 1)

    def take(switch: str) -> int:
        port = next_port[switch]
        next_port[switch] = port + 1
        return port

    host_switches: dict[str, list[str]] = {}
    for switch in switches:
        for host in nodes.get(switch, []):
            host_switches.setdefault(host, []).append(switch)
    cas: list[Ca] = []
    links: list[Link] = []
    for host, leaves in host_switches.items():
        for rail, leaf in enumerate(leaves):
            ca_guid = synthetic_guid("ca", host if len(leaves) == 1 else f"{host}@{leaf}")
            cas.append(Ca(guid=ca_guid, host=host, rail=rail if len(leaves) > 1 else None))
            links.append(Link(a=PortRef(ca_guid, 1), b=PortRef(guid[leaf], take(leaf)), width=width, speed=speed))
    down: list[tuple[str, str, int]] = []
    for parent in switches:
        for child in children.get(parent, []):
            down.append((child, parent, take(parent)))
    for child, parent, port in down:
        links.append(Link(a=PortRef(guid[child], take(child)), b=PortRef(guid[parent], port), width=width, speed=speed))
    return build_topology(
        name=name,
        hosts=[Host(name=h) for h in host_switches],
        cas=cas,
        switches=[Switch(guid=guid[s], name=s, radix=max(1, next_port[s] - 1)) for s in switches],
        links=links,
        warnings=warnings,
    )


@dataclass
class TreeEntry:
    """One switch of a tree file: where it is defined, its name, child switches and nodes."""

    line: int | None
    name: str
    switches: list[str] | None
    nodes: list[str] | None


def check_tree(
    entries: list[TreeEntry], file: str, strict: bool, warnings: list[str]
) -> tuple[list[str], dict[str, list[str]], dict[str, list[str]]]:
    """Checks the switches of a tree file; returns (switch order, children, nodes).

    Errors (a warning and the part left out when not `strict`): a switch defined twice, a child
    switch never defined, a cycle. Warnings: several parents, several roots, a node under two
    switches, a switch with both nodes and child switches or with neither.
    """

    def fail(line: int | None, reason: str) -> None:
        if strict:
            raise FormatError(file, line, reason)
        warnings.append(where(file, line, reason + "; left out"))

    defined: dict[str, TreeEntry] = {}
    for entry in entries:
        if entry.name in defined:
            first = defined[entry.name].line
            fail(entry.line, f"switch {entry.name} is defined twice (first at line {first})")
            continue
        defined[entry.name] = entry
        if len(entry.name) > 64:
            warnings.append(where(file, entry.line, f"switch name {entry.name[:20]}... is longer than 64 characters"))
    children: dict[str, list[str]] = {}
    for entry in defined.values():
        kept: list[str] = []
        for child in entry.switches or []:
            if child not in defined:
                fail(entry.line, f"switch {child}, a child of {entry.name}, is not defined")
            elif child == entry.name:
                fail(entry.line, f"switch {entry.name} lists itself: not a tree")
            elif child not in kept:
                kept.append(child)
        children[entry.name] = kept
        if entry.switches is not None and entry.nodes is not None:
            warnings.append(where(file, entry.line, f"switch {entry.name} has both Nodes= and Switches="))
        if not entry.switches and not entry.nodes:
            warnings.append(where(file, entry.line, f"switch {entry.name} has no nodes and no child switches"))
    # cycles: depth-first, in file order; a back edge is a cycle
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    for start in defined:
        if state.get(start):
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        path: list[str] = [start]
        state[start] = 1
        while stack:
            node, index = stack[-1]
            if index < len(children[node]):
                stack[-1] = (node, index + 1)
                child = children[node][index]
                if state.get(child) == 1:
                    cycle = [*path[path.index(child) :], child]
                    fail(
                        defined[node].line,
                        f"switches list each other in a cycle ({' -> '.join(cycle)}): not a tree",
                    )
                    children[node] = [c for c in children[node] if c != child]
                    stack[-1] = (node, index)
                elif not state.get(child):
                    state[child] = 1
                    stack.append((child, 0))
                    path.append(child)
            else:
                state[node] = 2
                stack.pop()
                path.pop()
    parents: dict[str, list[str]] = {}
    for parent, kids in children.items():
        for child in kids:
            parents.setdefault(child, []).append(parent)
    for child, ps in parents.items():
        if len(ps) > 1:
            warnings.append(
                where(file, defined[child].line, f"switch {child} has several parents ({', '.join(ps)}): not a tree")
            )
    roots = [s for s in defined if s not in parents]
    if len(roots) > 1:
        warnings.append(
            where(
                file,
                None,
                f"{len(roots)} top-level switches ({', '.join(roots[:6])}): no single switch reaches every node",
            )
        )
    nodes: dict[str, list[str]] = {}
    home: dict[str, str] = {}
    for entry in defined.values():
        nodes[entry.name] = list(dict.fromkeys(entry.nodes or []))
        for node in nodes[entry.name]:
            if node in home:
                warnings.append(where(file, entry.line, f"node {node} is under both {home[node]} and {entry.name}"))
            else:
                home[node] = entry.name
    return list(defined), children, nodes


def subset_topology(topology: Topology, nodes: Collection[str]) -> tuple[Topology, list[str]]:
    """Only the hosts in `nodes` (with their CAs and links); every switch, router and other link stays."""
    wanted = set(nodes)
    known = {h.name for h in topology.hosts}
    warnings: list[str] = []
    missing = sorted(wanted - known)
    if missing:
        warnings.append(f"{len(missing)} selected node(s) are not in the topology: {', '.join(missing[:10])}")
    dropped = {c.guid for c in topology.cas if c.host not in wanted}
    return (
        build_topology(
            name=topology.name,
            hosts=[h for h in topology.hosts if h.name in wanted],
            cas=[c for c in topology.cas if c.host in wanted],
            switches=topology.switches,
            routers=topology.routers,
            links=[ln for ln in topology.links if ln.a.guid not in dropped and ln.b.guid not in dropped],
            warnings=topology.warnings,
        ),
        warnings,
    )
