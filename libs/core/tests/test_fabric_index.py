"""FabricIndex against brute force: BFS distances, enumerated shortest paths, components from scratch."""

from __future__ import annotations

import itertools
import math
from collections import deque

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibpool_core.fabric import generators as gen
from ibpool_core.fabric.graph import Graph
from ibpool_core.fabric.index import FabricIndex
from ibpool_core.fabric.model import LANE_GBPS, Ca, Host, Link, LinkState, PortRef, Switch, Topology, build_topology


def sw_guid(i: int) -> str:
    return f"0x{0x1000 + i:016x}"


def ca_guid(i: int) -> str:
    return f"0x{0x2000 + i:016x}"


class Reference:
    """Slow, obvious answers computed straight from the topology."""

    def __init__(self, t: Topology) -> None:
        self.t = t
        self.switches = {s.guid for s in t.switches}
        self.adj: dict[str, dict[str, float]] = {g: {} for g in self.switches}
        self.ca_leaf: dict[str, dict[str, float]] = {c.guid: {} for c in t.cas}
        for ln in t.links:
            if ln.state == "down":
                continue
            a, b, w = ln.a.guid, ln.b.guid, ln.gbps
            if a in self.switches and b in self.switches:
                if a != b:
                    self.adj[a][b] = max(self.adj[a].get(b, 0.0), w)
                    self.adj[b][a] = max(self.adj[b].get(a, 0.0), w)
            elif a in self.switches and b in self.ca_leaf:
                self.ca_leaf[b][a] = max(self.ca_leaf[b].get(a, 0.0), w)
            elif b in self.switches and a in self.ca_leaf:
                self.ca_leaf[a][b] = max(self.ca_leaf[a].get(b, 0.0), w)
        usable = Topology(
            name=t.name, hosts=t.hosts, cas=t.cas, switches=t.switches, links=[x for x in t.links if x.state != "down"]
        )
        self.tiers = Graph(usable).tiers()
        by_host: dict[str, list[Ca]] = {}
        for c in t.cas:
            by_host.setdefault(c.host, []).append(c)
        self.rail_cas: dict[tuple[str, int], list[str]] = {}
        for host, cas in by_host.items():
            for pos, c in enumerate(sorted(cas, key=lambda c: (c.name, c.guid))):
                rail = pos if c.rail is None else c.rail
                if self.ca_leaf[c.guid]:
                    self.rail_cas.setdefault((host, rail), []).append(c.guid)

    def dist(self, src: str) -> dict[str, int]:
        d = {src: 0}
        q = deque([src])
        while q:
            u = q.popleft()
            for v in self.adj[u]:
                if v not in d:
                    d[v] = d[u] + 1
                    q.append(v)
        return d

    def widest_shortest(self, a: str, b: str) -> float | None:
        """Enumerate every shortest path a -> b and take the best bottleneck."""
        if a == b:
            return math.inf
        da, db = self.dist(a), self.dist(b)
        if b not in da:
            return None
        total = da[b]
        best = -1.0

        def walk(u: str, low: float) -> None:
            nonlocal best
            if u == b:
                best = max(best, low)
                return
            for v, w in self.adj[u].items():
                if da.get(v) == da[u] + 1 and db.get(v) == total - da[v]:
                    walk(v, min(low, w))

        walk(a, math.inf)
        return best

    def hops(self, h1: str, h2: str, rail: int | None) -> int | None:
        rails = [rail] if rail is not None else sorted({r for (h, r) in self.rail_cas if h == h1})
        best = None
        for r in rails:
            for c1 in self.rail_cas.get((h1, r), []):
                for c2 in self.rail_cas.get((h2, r), []):
                    if h1 == h2:
                        return 0
                    for l1 in self.ca_leaf[c1]:
                        d = self.dist(l1)
                        for l2 in self.ca_leaf[c2]:
                            if l2 in d and (best is None or d[l2] + 2 < best):
                                best = d[l2] + 2
        return best

    def bottleneck(self, h1: str, h2: str, rail: int | None) -> float | None:
        if h1 == h2:
            return None
        rails = [rail] if rail is not None else sorted({r for (h, r) in self.rail_cas if h == h1})
        best = None
        for r in rails:
            for c1 in self.rail_cas.get((h1, r), []):
                for c2 in self.rail_cas.get((h2, r), []):
                    for l1, w1 in self.ca_leaf[c1].items():
                        for l2, w2 in self.ca_leaf[c2].items():
                            core = self.widest_shortest(l1, l2)
                            if core is not None:
                                c = min(w1, w2, core)
                                best = c if best is None else max(best, c)
        return best

    def components(self, level: int) -> list[tuple[frozenset[str], frozenset[str]]]:
        """(switches, hosts) of each subtree at `level`, by plain BFS over hosts + switches."""
        nodes: dict[str, set[str]] = {g: set() for g, t in self.tiers.items() if 0 < t <= level}
        for g in nodes:
            nodes[g].update(n for n in self.adj[g] if n in nodes)
        for (host, _r), cas in self.rail_cas.items():
            nodes.setdefault("host:" + host, set())
            for c in cas:
                for leaf in self.ca_leaf[c]:
                    nodes["host:" + host].add(leaf)
                    nodes[leaf].add("host:" + host)
        seen: set[str] = set()
        out = []
        for start in nodes:
            if start in seen:
                continue
            comp = {start}
            q = deque([start])
            while q:
                for v in nodes[q.popleft()]:
                    if v not in comp:
                        comp.add(v)
                        q.append(v)
            seen |= comp
            hosts = frozenset(x[5:] for x in comp if x.startswith("host:"))
            if hosts:
                out.append((frozenset(x for x in comp if not x.startswith("host:")), hosts))
        return out


def check_against_reference(t: Topology, *, pairs: int | None = None) -> FabricIndex:
    ix, ref = FabricIndex(t), Reference(t)
    assert ix.tiers == ref.tiers
    names = [h.name for h in t.hosts]
    all_pairs = list(itertools.product(names, names))
    for h1, h2 in all_pairs[:pairs] if pairs else all_pairs:
        for rail in (None, 0, 1):
            assert ix.hops(h1, h2, rail) == ref.hops(h1, h2, rail), (h1, h2, rail)
            assert ix.bottleneck_gbps(h1, h2, rail) == ref.bottleneck(h1, h2, rail), (h1, h2, rail)
    for level in range(1, ix.levels + 1):
        got = {(frozenset(s.switches), frozenset(s.hosts)) for s in ix.subtrees(level)}
        assert got == set(ref.components(level)), level
    return ix


@st.composite
def irregular(draw: st.DrawFn) -> Topology:
    """Random switches and cables (any shape: parallel, same-tier, disconnected), random hosts
    with one or two adapters, some with rails, some links down or degraded."""
    n_sw = draw(st.integers(1, 9))
    radix = 12
    switches = [Switch(guid=sw_guid(i), name=f"s{i}", radix=radix, sharp=draw(st.booleans())) for i in range(n_sw)]
    next_port = [1] * n_sw
    links: list[Link] = []

    def port(i: int) -> int | None:
        if next_port[i] > radix:
            return None
        next_port[i] += 1
        return next_port[i] - 1

    state: st.SearchStrategy[LinkState] = st.sampled_from(["up", "up", "up", "down", "degraded"])
    width = st.sampled_from([4, 4, 1, 2])
    for a, b in draw(st.lists(st.tuples(st.integers(0, n_sw - 1), st.integers(0, n_sw - 1)), max_size=18)):
        if a == b:
            continue
        pa, pb = port(a), port(b)
        if pa and pb:
            links.append(
                Link(a=PortRef(sw_guid(a), pa), b=PortRef(sw_guid(b), pb), width=draw(width), state=draw(state))
            )
    hosts, cas = [], []
    n_hosts = draw(st.integers(1, 7))
    for h in range(n_hosts):
        hosts.append(Host(name=f"h{h}"))
        railed = draw(st.booleans())
        for r in range(draw(st.integers(1, 2))):
            g = ca_guid(h * 4 + r)
            cas.append(Ca(guid=g, host=f"h{h}", name=f"mlx5_{r}", rail=r if railed else None))
            if draw(st.integers(0, 9)) == 0:
                continue  # an uncabled adapter
            leaf = draw(st.integers(0, n_sw - 1))
            p = port(leaf)
            if p:
                links.append(Link(a=PortRef(g, 1), b=PortRef(sw_guid(leaf), p), width=draw(width), state=draw(state)))
    return build_topology(hosts=hosts, cas=cas, switches=switches, links=links)


@settings(max_examples=120, deadline=None)
@given(irregular())
def test_irregular_fabrics_match_brute_force(t: Topology) -> None:
    check_against_reference(t)


@settings(max_examples=120, deadline=None)
@given(irregular(), st.data())
def test_covering_subtree_is_the_lowest_that_holds_them(t: Topology, data: st.DataObject) -> None:
    ix, ref = FabricIndex(t), Reference(t)
    names = [h.name for h in t.hosts]
    chosen = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=5, unique=True))
    got = ix.covering_subtree(chosen)
    want = None
    for level in range(1, ix.levels + 1):
        for switches, hosts in ref.components(level):
            if set(chosen) <= hosts:
                want = (level, switches, hosts)
                break
        if want:
            break
    if want is None:
        assert got is None
    else:
        assert got is not None and (got.level, frozenset(got.switches), frozenset(got.hosts)) == want
        # nested: the subtree of a host at a higher level contains the lower one
        for level in range(got.level, ix.levels + 1):
            higher = ix.subtree_of(chosen[0], level)
            assert higher is not None and set(got.switches) <= set(higher.switches)


@pytest.mark.parametrize(
    "topology",
    [
        gen.fat_tree_2tier(20, radix=8, oversubscription=3, gpus_per_host=0),
        gen.fat_tree_3tier(40, radix=6, gpus_per_host=0),
        gen.rail_optimised(40, rails=2, su_size=4, radix=8, gpus_per_host=0),  # 3 tiers
        gen.rail_optimised(70, rails=2, su_size=4, radix=8, gpus_per_host=0),  # rail planes
        gen.torus_3d(3, 2, 4, gpus_per_host=0),
        gen.dragonfly(4, 3, 2, 1, gpus_per_host=0),
    ],
    ids=["fat2", "fat3", "rail3", "railplanes", "torus", "dragonfly"],
)
def test_generated_fabrics_match_brute_force(topology: Topology) -> None:
    ix = check_against_reference(topology, pairs=900)
    if ix.tree_like:  # fat-trees are answered without any search
        assert not ix._bfs_cache


def test_rails_follow_port_order_when_not_given() -> None:
    t = build_topology(
        hosts=[Host(name="a"), Host(name="b")],
        cas=[
            Ca(guid=ca_guid(1), host="a", name="mlx5_1"),
            Ca(guid=ca_guid(2), host="a", name="mlx5_0"),
            Ca(guid=ca_guid(3), host="b", name="mlx5_0", rail=1),
        ],
        switches=[Switch(guid=sw_guid(0), name="s0", radix=8), Switch(guid=sw_guid(1), name="s1", radix=8)],
        links=[
            Link(a=PortRef(ca_guid(2), 1), b=PortRef(sw_guid(0), 1)),
            Link(a=PortRef(ca_guid(1), 1), b=PortRef(sw_guid(1), 1)),
            Link(a=PortRef(ca_guid(3), 1), b=PortRef(sw_guid(1), 2)),
        ],
    )
    ix = FabricIndex(t)
    assert ix.rails("a") == (0, 1) and ix.rails("b") == (1,)
    assert ix.leaf_of("a", 0) == sw_guid(0) and ix.leaf_of("a", 1) == sw_guid(1)
    assert ix.hops("a", "b", 1) == 2 and ix.hops("a", "b", 0) is None and ix.hops("a", "b") == 2
    assert ix.hops("a", "a") == 0 and ix.bottleneck_gbps("a", "a") is None
    assert ix.leaf_of("b", 0) is None
    # two switches with no cable between them: no common subtree
    assert ix.covering_subtree(["a"]) is not None and ix.levels == 1
    with pytest.raises(KeyError, match="unknown host 'zz'"):
        ix.hops("a", "zz")
    with pytest.raises(ValueError):
        ix.covering_subtree([])


def with_states(t: Topology, changes: dict[str, tuple[str, int]]) -> Topology:
    """The same fabric with some links (by link_id) set to (state, width)."""
    links = [
        msgspec.structs.replace(ln, state=changes[ln.link_id][0], width=changes[ln.link_id][1])
        if ln.link_id in changes
        else ln
        for ln in t.links
    ]
    return build_topology(hosts=t.hosts, cas=t.cas, switches=t.switches, links=links)


def test_down_links_are_not_paths_and_degraded_links_narrow_the_bottleneck() -> None:
    t = gen.fat_tree_2tier(8, radix=8, gpus_per_host=0)  # 2 leaves x 4 hosts, 4 spines
    ix = FabricIndex(t)
    assert ix.hops("node001", "node005") == 4 and ix.bottleneck_gbps("node001", "node005") == 400.0
    leaf1 = ix.leaf_of("node001")
    switches = {s.guid for s in t.switches}
    uplinks = [ln.link_id for ln in t.links if leaf1 in (ln.a.guid, ln.b.guid) and {ln.a.guid, ln.b.guid} <= switches]
    assert len(uplinks) == 4
    ix2 = FabricIndex(with_states(t, {uplinks[0]: ("down", 4), uplinks[1]: ("degraded", 1)}))
    assert ix2.hops("node001", "node005") == 4 and ix2.bottleneck_gbps("node001", "node005") == 400.0
    # all uplinks but the degraded one down: the only path runs at 1x
    changes = {uplinks[1]: ("degraded", 1), **{u: ("down", 4) for u in (uplinks[0], *uplinks[2:])}}
    ix3 = FabricIndex(with_states(t, changes))
    assert ix3.hops("node001", "node005") == 4
    assert ix3.bottleneck_gbps("node001", "node005") == 1 * LANE_GBPS["NDR"]
    # the bisection of the whole now counts leaf 1's single 100G uplink for its 4 hosts
    top = ix3.covering_subtree(ix3.hosts)
    assert top is not None and ix3.bisection_gbps(top) == 8 / 2 * (100 / 4)
    # every uplink down: the leaves are apart
    ix4 = FabricIndex(with_states(t, {u: ("down", 4) for u in uplinks}))
    assert ix4.hops("node001", "node005") is None and ix4.bottleneck_gbps("node001", "node005") is None
    assert ix4.covering_subtree(["node001", "node005"]) is None


def test_rail_optimised_levels_are_scalable_units_then_the_fabric() -> None:
    ix = FabricIndex(gen.rail_optimised(127, gpus_per_host=0))
    assert ix.levels == 2 and len(ix.leaves) == 32
    groups = ix.leaf_groups()
    assert [len(g.hosts) for g in groups] == [32, 32, 32, 31] and all(len(g.switches) == 8 for g in groups)
    assert groups[0].hosts[0] == "dgx001" and groups[3].hosts[-1] == "dgx127"
    assert ix.covering_subtree(["dgx001", "dgx032"]) == groups[0]
    top = ix.covering_subtree(["dgx001", "dgx033"])
    assert top is not None and top.level == 2 and len(top.hosts) == 127 and len(top.switches) == 48
    assert ix.hops("dgx001", "dgx032") == 2 and ix.hops("dgx001", "dgx033") == 4
    assert ix.hops("dgx001", "dgx033", rail=5) == 4
    assert ix.bottleneck_gbps("dgx001", "dgx127") == 400.0
    # full bisection: 8 rails x 400G per host
    assert ix.bisection_gbps(top) == 127 / 2 * 8 * 400
    assert ix.bisection_gbps(groups[0]) == 32 / 2 * 8 * 400
    # every switch is a Quantum-2: every subtree is SHARP-capable, the whole fabric first
    sharp = ix.sharp_subtrees()
    assert sharp[0] == top and len(sharp) == 5


def test_blocks_stay_inside_the_lowest_subtree() -> None:
    ix = FabricIndex(gen.rail_optimised(127, gpus_per_host=0))
    b16 = ix.blocks(16)
    assert len(b16) == 7 and all(len(b) == 16 for b in b16)  # 2 + 2 + 2 + 1 (31 hosts -> one block)
    for b in b16:
        st_ = ix.covering_subtree(b)
        assert st_ is not None and st_.level == 1
    assert "dgx127" not in {h for b in b16 for h in b}
    b64 = ix.blocks(64)  # bigger than a scalable unit: cut at level 2, SU by SU
    assert [len(b) for b in b64] == [64]
    assert b64[0] == tuple(f"dgx{i:03d}" for i in range(1, 65))
    assert ix.blocks(500) == []
    with pytest.raises(ValueError):
        ix.blocks(0)


def test_sharp_subtrees_need_every_switch_sharp() -> None:
    base = gen.fat_tree_2tier(12, radix=8, gpus_per_host=0, sharp=True)  # 3 leaves, 4 spines
    # one leaf loses SHARP: its leaf group and the whole fabric are out
    off = next(s.guid for s in base.switches if s.name == "leaf002")
    t = build_topology(
        hosts=base.hosts,
        cas=base.cas,
        switches=[Switch(guid=s.guid, name=s.name, radix=s.radix, sharp=s.guid != off) for s in base.switches],
        links=base.links,
    )
    ix = FabricIndex(t)
    sharp = ix.sharp_subtrees()
    assert [s.level for s in sharp] == [1, 1]
    assert {s.hosts[0] for s in sharp} == {"node001", "node009"}
    assert all(s.sharp for s in sharp)


def test_bisection_is_undefined_for_direct_networks_and_zero_for_one_host() -> None:
    ix = FabricIndex(gen.torus_3d(3, 3, 1, gpus_per_host=0))
    assert not ix.tree_like
    top = ix.covering_subtree(ix.hosts)
    assert top is not None and ix.bisection_gbps(top) is None
    one = FabricIndex(gen.single_switch(1, gpus_per_host=0))
    assert one.bisection_gbps(one.leaf_groups()[0]) == 0.0
    other = FabricIndex(gen.single_switch(3, gpus_per_host=0))
    with pytest.raises(ValueError):
        ix.bisection_gbps(other.leaf_groups()[0])


def test_empty_topology() -> None:
    ix = FabricIndex(build_topology())
    assert ix.levels == 0 and ix.leaves == () and ix.leaf_groups() == [] and ix.sharp_subtrees() == []
    assert ix.blocks(1) == []
