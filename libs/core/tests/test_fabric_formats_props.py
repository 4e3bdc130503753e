"""Property tests of the formats on small random fabrics (trees, fat trees, rail-optimised).

- native -> any exporter -> its importer keeps the leaf groups (the host set of each leaf group);
- every Slurm tree we write is one slurmctld accepts (one root, each node under one leaf, no cycle);
- Slurm tree -> model -> Slurm tree is the same file up to ordering;
- ibnetdiscover -> model -> ibnetdiscover -> model is exact.
"""

from __future__ import annotations

import os
import random
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ibpool_core.fabric.formats import (
    build_hierarchy,
    export_topology,
    import_topology,
    leaf_groups,
)
from ibpool_core.fabric.formats.ibnetdiscover import export_ibnetdiscover, import_ibnetdiscover
from ibpool_core.fabric.formats.native import export_native, import_native
from ibpool_core.fabric.formats.slurm import compress_hostlist, expand_hostlist, export_slurm_tree, import_slurm_tree
from ibpool_core.fabric.formats.volcano import hostlist_regex
from ibpool_core.fabric.model import Ca, Host, Link, PortRef, Switch, Topology, build_topology

EXAMPLES = int(os.environ.get("IBPOOL_HYPOTHESIS_EXAMPLES", "100"))  # more for a long hunt
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPEEDS = ["QDR", "EDR", "HDR", "NDR"]


class Builder:
    """A tiny random fabric builder (GUIDs by counter, ports handed out in order)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.switches: list[Switch] = []
        self.hosts: list[Host] = []
        self.cas: list[Ca] = []
        self.links: list[Link] = []
        self.next_port: dict[str, int] = {}
        self.count = 0
        prefix = rng.choice(["gpu", "node", "cn-", "dgx"])
        width = rng.choice([0, 3])
        numbers = rng.sample(range(1, 400), 200)
        self.names = iter(f"{prefix}{n:0{width}d}" for n in numbers)

    def guid(self) -> str:
        self.count += 1
        return f"0x{0x1000 + self.count:016x}"

    def switch(self, name: str) -> str:
        guid = self.guid()
        self.switches.append(Switch(guid=guid, name=name, radix=1, model="QM9700"))
        self.next_port[guid] = 1
        return guid

    def port(self, guid: str) -> int:
        port = self.next_port[guid]
        self.next_port[guid] = port + 1
        return port

    def cable(self, a: str, b: str) -> None:
        speed = self.rng.choice(SPEEDS)
        self.links.append(Link(a=PortRef(a, self.port(a)), b=PortRef(b, self.port(b)), speed=speed))

    def host(self, leaves: list[str]) -> None:
        name = next(self.names)
        self.hosts.append(Host(name=name))
        for rail, leaf in enumerate(leaves):
            ca = self.guid()
            self.cas.append(Ca(guid=ca, host=name, name=f"mlx5_{rail}", rail=rail if len(leaves) > 1 else None))
            self.links.append(Link(a=PortRef(ca, 1), b=PortRef(leaf, self.port(leaf)), speed="NDR"))

    def build(self) -> Topology:
        switches = [
            Switch(guid=s.guid, name=s.name, radix=max(1, self.next_port[s.guid] - 1), model=s.model)
            for s in self.switches
        ]
        return build_topology(name="random", hosts=self.hosts, cas=self.cas, switches=switches, links=self.links)


def tree(rng: random.Random) -> Topology:
    """A random rooted tree of switches, links child (a) -> parent (b); leaves carry 1-4 hosts."""
    b = Builder(rng)

    def grow(depth: int) -> str:
        me = b.switch(f"sw{len(b.switches)}")
        if depth == 0 or rng.random() < 0.3:
            for _ in range(rng.randint(1, 4)):
                b.host([me])
        else:
            for _ in range(rng.randint(1, 3)):
                b.cable(grow(depth - 1), me)
        return me

    grow(rng.randint(0, 3))
    return b.build()


def fat_tree(rng: random.Random) -> Topology:
    """Leaves under a random subset of spines (cables in random a/b order), maybe a core above."""
    b = Builder(rng)
    leaves = [b.switch(f"leaf{i}") for i in range(rng.randint(1, 5))]
    spines = [b.switch(f"spine{i}") for i in range(rng.randint(0, 3))]
    for leaf in leaves:
        for spine in rng.sample(spines, rng.randint(1, len(spines))) if spines else []:
            for _ in range(rng.randint(1, 2)):
                b.cable(*rng.sample([leaf, spine], 2))
        for _ in range(rng.randint(1, 4)):
            b.host([leaf] if rng.random() < 0.85 or len(leaves) == 1 else rng.sample(leaves, 2))
    if spines and rng.random() < 0.4:
        core = b.switch("core")
        for spine in spines:
            b.cable(spine, core)
    return b.build()


def rail_optimised(rng: random.Random) -> Topology:
    """Scalable units of hosts with one HCA per rail, each rail on its own leaf; spines per rail."""
    b = Builder(rng)
    units, rails = rng.randint(1, 3), rng.randint(1, 4)
    leaf = {(u, r): b.switch(f"su{u}-rail{r}") for u in range(units) for r in range(rails)}
    for r in range(rails):
        for s in range(rng.randint(0, 2)):
            spine = b.switch(f"rail{r}-spine{s}")
            for u in range(units):
                b.cable(leaf[u, r], spine)
    for u in range(units):
        for _ in range(rng.randint(1, 4)):
            b.host([leaf[u, r] for r in range(rails)])
    return b.build()


fabrics = st.builds(
    lambda kind, seed: kind(random.Random(seed)),
    st.sampled_from([tree, fat_tree, rail_optimised]),
    st.integers(0, 2**32),
)


def fabric_parts(topology: Topology) -> int:
    """How many parts of the fabric hold hosts, where links between switches and a host's adapters
    on several leaves join switches into one part."""
    switches = {s.guid for s in topology.switches}
    part = {g: g for g in switches}

    def find(g: str) -> str:
        while part[g] != g:
            g = part[g]
        return g

    host_leaves: dict[str, set[str]] = {}
    host_of = {c.guid: c.host for c in topology.cas}
    for link in topology.links:
        a, b = link.a.guid, link.b.guid
        if a in switches and b in switches:
            part[find(a)] = find(b)
        elif a in host_of or b in host_of:
            host, leaf = (host_of[a], b) if a in host_of else (host_of[b], a)
            host_leaves.setdefault(host, set()).add(leaf)
    for leaves in host_leaves.values():
        first, *rest = sorted(leaves)
        for leaf in rest:
            part[find(leaf)] = find(first)
    return len({find(leaf) for leaves in host_leaves.values() for leaf in leaves})


def structural_warnings(warnings: list[str]) -> list[str]:
    return [w for w in warnings if re.search(r"parents|top-level|under both|cycle|not defined", w)]


@SETTINGS
@given(fabrics, st.sampled_from(["slurm", "slurm-block", "slurm-yaml", "k8s-labels", "volcano", "ibnetdiscover"]))
def test_native_then_any_exporter_then_its_importer_keeps_the_leaf_groups(topology: Topology, kind: str) -> None:
    native = import_native(export_native(topology).text, file="t.json")
    assert native == topology
    exported = export_topology(kind, native)
    reader = {"slurm-yaml": "slurm"}.get(kind, kind)
    back = import_topology(reader, exported.text, file=f"t.{kind}")
    assert leaf_groups(build_hierarchy(back)) == leaf_groups(build_hierarchy(topology))


@SETTINGS
@given(fabrics)
def test_every_slurm_tree_we_write_is_a_tree_slurmctld_accepts(topology: Topology) -> None:
    exported = export_slurm_tree(topology)
    back = import_slurm_tree(exported.text, file="ours.conf")  # strict: no cycle, no undefined switch
    parts = fabric_parts(topology)
    assert [w for w in structural_warnings(back.warnings) if not (parts > 1 and "top-level" in w)] == []
    placed = [
        n for line in exported.text.splitlines() if "Nodes=" in line for n in expand_hostlist(line.split("=")[-1])
    ]
    assert sorted(placed) == sorted(h.name for h in topology.hosts)  # every node under exactly one leaf
    roots = {s[0] for s in structure(exported.text)} - {c for s in structure(exported.text) for c in s[1]}
    assert len(roots) == parts  # one top per part of the fabric: a disconnected one stays disconnected
    # multi-rail hosts sit under the one group of leaves they share
    assert {frozenset(g) for g in leaf_groups(build_hierarchy(back))} == leaf_groups(build_hierarchy(topology))


def slurm_tree_text(rng: random.Random) -> str:
    topology = tree(rng)
    lines = export_slurm_tree(topology).text.splitlines()[1:]
    rng.shuffle(lines)
    return "\n".join(lines) + "\n"


def structure(text: str) -> set[tuple[str, frozenset[str], frozenset[str]]]:
    out = set()
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = dict(token.split("=", 1) for token in line.split())
        out.add(
            (
                fields["SwitchName"],
                frozenset(expand_hostlist(fields.get("Switches", ""))),
                frozenset(expand_hostlist(fields.get("Nodes", ""))),
            )
        )
    return out


@SETTINGS
@given(st.integers(0, 2**32))
def test_slurm_tree_to_model_to_slurm_tree_is_the_same_up_to_ordering(seed: int) -> None:
    text = slurm_tree_text(random.Random(seed))
    topology = import_slurm_tree(text, file="in.conf")
    assert topology.warnings == []
    again = export_slurm_tree(topology)
    assert again.warnings == []
    assert structure(again.text) == structure(text)


@SETTINGS
@given(fabrics)
def test_ibnetdiscover_round_trip_is_exact(topology: Topology) -> None:
    dump = export_ibnetdiscover(topology).text
    back = import_ibnetdiscover(dump, file="t.topo", name=topology.name)
    assert back.warnings == []
    assert (back.hosts, back.cas, back.switches) == (topology.hosts, topology.cas, topology.switches)

    def cables(t: Topology) -> set[tuple[object, ...]]:
        switch_ids = {s.guid for s in t.switches}
        out: set[tuple[object, ...]] = set()
        for ln in t.links:
            between_switches = ln.a.guid in switch_ids and ln.b.guid in switch_ids
            out.add(((ln.a, ln.b) if between_switches else ln.ends, ln.width, ln.speed))
        return out

    if structural_cycle_free(topology):
        assert cables(back) == cables(topology)  # even which end of a switch cable is `a`
        assert export_ibnetdiscover(back).text == dump
    else:  # cables a -> b that go round in a cycle: the dump's section order decides which end is `a`
        assert {(ln.ends, ln.width, ln.speed) for ln in back.links} == {
            (ln.ends, ln.width, ln.speed) for ln in topology.links
        }
        again = import_ibnetdiscover(export_ibnetdiscover(back).text, file="t2.topo", name=topology.name)
        assert export_ibnetdiscover(again).text == export_ibnetdiscover(back).text


def structural_cycle_free(topology: Topology) -> bool:
    switch_ids = {s.guid for s in topology.switches}
    after: dict[str, set[str]] = {}
    for ln in topology.links:
        if ln.a.guid in switch_ids and ln.b.guid in switch_ids:
            after.setdefault(ln.a.guid, set()).add(ln.b.guid)
    state: dict[str, int] = {}

    def visit(g: str) -> bool:
        state[g] = 1
        for n in after.get(g, ()):
            if state.get(n) == 1 or (n not in state and not visit(n)):
                return False
        state[g] = 2
        return True

    return all(visit(g) for g in list(after) if g not in state)


names = st.lists(
    st.builds(
        lambda prefix, n, width: f"{prefix}{n:0{width}d}",
        st.sampled_from(["gpu", "n", "rack1-node"]),
        st.integers(0, 1200),
        st.sampled_from([0, 2, 4]),
    ),
    min_size=1,
    max_size=40,
    unique=True,
)


@SETTINGS
@given(names, names)
def test_hostlist_regex_matches_exactly_the_names(chosen: list[str], others: list[str]) -> None:
    pattern = re.compile(hostlist_regex(chosen))
    for name in set(chosen) | set(others):
        assert bool(pattern.fullmatch(name)) == (name in chosen), (name, pattern.pattern, compress_hostlist(chosen))
