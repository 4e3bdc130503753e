"""Generators: property tests (radix, reachability, hop diameter, bisection) and published SuperPOD counts."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibpool_core.fabric import generators as gen
from ibpool_core.fabric.index import FabricIndex
from ibpool_core.fabric.model import Topology, content_hash

NDR = 400.0
FAST = settings(max_examples=25, deadline=None)


def check_ports(t: Topology) -> None:
    """No switch uses more ports than its radix, and no port number exceeds it."""
    radix = {s.guid: s.radix for s in t.switches}
    used: Counter[str] = Counter()
    for ln in t.links:
        for end in (ln.a, ln.b):
            if end.guid in radix:
                used[end.guid] += 1
                assert 1 <= end.port <= radix[end.guid]
    assert all(used[g] <= radix[g] for g in used)


def diameter(ix: FabricIndex, rail: int | None = None) -> int:
    """Largest host-to-host hop count; every pair must be reachable."""
    hosts = ix.hosts
    worst = 0
    for a, b in itertools.combinations(hosts, 2):
        d = ix.hops(a, b, rail)
        assert d is not None, (a, b)
        worst = max(worst, d)
    return worst


def check_common(t: Topology, again: Topology) -> FabricIndex:
    check_ports(t)
    assert content_hash(t) == content_hash(again)  # deterministic
    ix = FabricIndex(t)
    assert ix.covering_subtree(ix.hosts) is not None  # one fabric holds every host
    return ix


def top_bisection(ix: FabricIndex) -> float | None:
    top = ix.covering_subtree(ix.hosts)
    assert top is not None
    return ix.bisection_gbps(top)


@FAST
@given(st.integers(1, 16), st.sampled_from([16, 36]))
def test_single_switch(hosts: int, radix: int) -> None:
    t = gen.single_switch(hosts, radix, gpus_per_host=1)
    ix = check_common(t, gen.single_switch(hosts, radix, gpus_per_host=1))
    assert ix.levels == 1 and len(ix.leaves) == 1
    if hosts > 1:
        assert diameter(ix) == 2
    assert top_bisection(ix) == (hosts / 2 * NDR if hosts > 1 else 0.0)


def test_parameter_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        gen.single_switch(65)
    with pytest.raises(ValueError, match="at most 8"):
        gen.fat_tree_2tier(8 * 4 + 1, radix=8)
    with pytest.raises(ValueError, match="oversubscription"):
        gen.fat_tree_2tier(4, oversubscription=0.5)
    with pytest.raises(ValueError, match="unknown speed"):
        gen.single_switch(2, speed="WARP")
    with pytest.raises(ValueError, match="cannot join"):
        gen.dragonfly(6, 2, 1, 2)
    with pytest.raises(ValueError, match="ports"):
        gen.torus_3d(3, 3, 3, hosts_per_switch=31)
    with pytest.raises(ValueError, match="pods per rail"):
        gen.rail_optimised(8 * 4 * 9, rails=2, su_size=4, radix=8)


@st.composite
def fat_params(draw: st.DrawFn, tiers: int) -> tuple[int, int, float]:
    radix = draw(st.sampled_from([4, 6, 8] if tiers == 3 else [4, 6, 8, 12, 16]))
    ratio = draw(st.sampled_from([1.0, 2.0, 3.0]))
    down, _up = gen._split_ports(radix, ratio)
    most = radix * down if tiers == 2 else radix * (radix // 2) * down
    hosts = draw(st.integers(1, min(most, 96)))
    return hosts, radix, ratio


@FAST
@given(fat_params(2))
def test_fat_tree_2tier(params: tuple[int, int, float]) -> None:
    hosts, radix, ratio = params
    t = gen.fat_tree_2tier(hosts, radix, ratio, gpus_per_host=0)
    ix = check_common(t, gen.fat_tree_2tier(hosts, radix, ratio, gpus_per_host=0))
    down, up = gen._split_ports(radix, ratio)
    assert down == ratio * up
    leaves = math.ceil(hosts / down)
    tiers = Counter(ix.tiers.values())
    assert tiers == Counter({1: leaves, 2: up})
    if hosts > 1:
        assert diameter(ix) == (4 if leaves > 1 else 2)  # 2 * tiers between different leaves
    # bisection: N/2 * rate / ratio across leaves; a single leaf is a crossbar
    want = hosts / 2 * NDR / (ratio if leaves > 1 else 1) if hosts > 1 else 0.0
    assert top_bisection(ix) == pytest.approx(want)


@FAST
@given(fat_params(3))
def test_fat_tree_3tier(params: tuple[int, int, float]) -> None:
    hosts, radix, ratio = params
    t = gen.fat_tree_3tier(hosts, radix, ratio, gpus_per_host=0)
    ix = check_common(t, gen.fat_tree_3tier(hosts, radix, ratio, gpus_per_host=0))
    down, up = gen._split_ports(radix, ratio)
    half = radix // 2
    pods = math.ceil(hosts / (half * down))
    edges = Counter(int(ix.tiers[s.guid] == 1) for s in t.switches)[1]
    assert Counter(ix.tiers.values()) == Counter({1: edges, 2: pods * up, 3: up * half})
    if hosts > 1:
        assert diameter(ix) == (6 if pods > 1 else 4 if edges > 1 else 2)
    want = hosts / 2 * NDR / (ratio if edges > 1 else 1) if hosts > 1 else 0.0
    assert top_bisection(ix) == pytest.approx(want)


def test_textbook_k_ary_fat_tree() -> None:
    """k = 8: 128 hosts, 32 edge + 32 aggregation + 16 core switches, full bisection 64 x 400G."""
    ix = FabricIndex(gen.fat_tree_3tier(128, radix=8, gpus_per_host=0))
    assert Counter(ix.tiers.values()) == Counter({1: 32, 2: 32, 3: 16})
    assert top_bisection(ix) == 64 * NDR
    assert [len(s.hosts) for s in ix.subtrees(2)] == [16] * 8  # pods
    ix2 = FabricIndex(gen.fat_tree_3tier(96, radix=8, oversubscription=2, gpus_per_host=0))
    assert top_bisection(ix2) == 96 / 2 * NDR / 2


@FAST
@given(st.integers(1, 5), st.integers(1, 4), st.integers(1, 4), st.integers(1, 2))
def test_torus(x: int, y: int, z: int, per: int) -> None:
    t = gen.torus_3d(x, y, z, hosts_per_switch=per, gpus_per_host=0)
    ix = check_common(t, gen.torus_3d(x, y, z, hosts_per_switch=per, gpus_per_host=0))
    assert len(t.switches) == x * y * z and len(t.hosts) == x * y * z * per
    # every switch has hosts: one tier; wraparound gives each switch 2 cables per dimension >= 2
    assert set(ix.tiers.values()) == {1}
    degree: Counter[str] = Counter()
    for ln in t.links:
        if ln.a.guid in ix.tiers and ln.b.guid in ix.tiers:
            degree[ln.a.guid] += 1
            degree[ln.b.guid] += 1
    assert all(degree[s.guid] == 2 * sum(d >= 2 for d in (x, y, z)) for s in t.switches)
    if len(t.hosts) > 1:
        assert diameter(ix) == 2 + x // 2 + y // 2 + z // 2


@st.composite
def dragonfly_params(draw: st.DrawFn) -> tuple[int, int, int, int]:
    g = draw(st.integers(1, 7))
    a = draw(st.integers(1, 4))
    h = draw(st.integers(max(0, math.ceil((g - 1) / a)), 3 if g - 1 <= 3 * a else 9))
    return g, a, draw(st.integers(1, 2)), h


@FAST
@given(dragonfly_params())
def test_dragonfly(params: tuple[int, int, int, int]) -> None:
    g, a, p, h = params
    t = gen.dragonfly(g, a, p, h, gpus_per_host=0)
    ix = check_common(t, gen.dragonfly(g, a, p, h, gpus_per_host=0))
    assert len(t.switches) == g * a and len(t.hosts) == g * a * p
    names = {s.guid: s.name for s in t.switches}
    pairs: set[tuple[str, str]] = set()
    for ln in t.links:
        if ln.a.guid in names and ln.b.guid in names:
            ga, gb = names[ln.a.guid].split("-")[1], names[ln.b.guid].split("-")[1]
            if ga != gb:
                pairs.add((min(ga, gb), max(ga, gb)))
    assert len(pairs) == g * (g - 1) // 2  # every pair of groups has a global link
    if len(t.hosts) > 1:
        want = 2 if g * a == 1 else 3 if g == 1 else None
        d = diameter(ix)
        assert d <= 5 and (want is None or d == want)


@FAST
@given(st.integers(1, 128))
def test_rail_optimised_small_radix_all_regimes(hosts: int) -> None:
    """radix 8, SUs of 4, 2 rails: two tiers up to 4 SUs, three tiers with a shared core up to 16,
    rail planes beyond. Every host has every rail, one leaf per rail per SU, full bisection."""
    kw = {"rails": 2, "su_size": 4, "radix": 8, "gpus_per_host": 0}
    t = gen.rail_optimised(hosts, **kw)  # type: ignore[arg-type]
    ix = check_common(t, gen.rail_optimised(hosts, **kw))  # type: ignore[arg-type]
    sus = math.ceil(hosts / 4)
    assert len(ix.leaves) == 2 * sus
    for i, h in enumerate(ix.hosts):
        assert ix.rails(h) == (0, 1)
        for r in (0, 1):
            leaf = ix.leaf_of(h, r)
            assert leaf is not None and ix.graph.switches[leaf].name == f"leaf-su{i // 4 + 1}-r{r}"
    assert ix.levels == (2 if sus <= 4 else 3)
    if hosts > 1:
        want = 2 if sus == 1 else 4 if sus <= 4 else 6
        assert diameter(ix, rail=0) == want and diameter(ix) == want
    if sus > 1:
        assert top_bisection(ix) == pytest.approx(hosts / 2 * 2 * NDR)
    planes = sus > 16
    cores = [s for s in t.switches if s.name.startswith("core-")]
    assert all(s.name.startswith("core-r") for s in cores) == planes or not cores


# DGX SuperPOD H100 reference architecture, Table 4 (compute fabric component count):
# (hosts, SUs, GPUs, leaves, spines, node+UFM cables, spine-leaf cables)
PUBLISHED_H100 = [
    (31, 1, 248, 8, 4, 252, 256),
    (63, 2, 504, 16, 8, 508, 512),
    (95, 3, 760, 24, 16, 764, 768),
    (127, 4, 1016, 32, 16, 1020, 1024),
]
UFM_CABLES = 4  # the 4 UFM appliance cables take the slot of the missing DGX; not modelled


@pytest.mark.parametrize(("hosts", "sus", "gpus", "leaves", "spines", "node_cables", "leaf_cables"), PUBLISHED_H100)
def test_published_superpod_h100_counts(
    hosts: int, sus: int, gpus: int, leaves: int, spines: int, node_cables: int, leaf_cables: int
) -> None:
    t = gen.rail_optimised(hosts)
    check_ports(t)
    ix = FabricIndex(t)
    tiers = Counter(ix.tiers.values())
    assert tiers == Counter({1: leaves, 2: spines})
    assert sum(len(h.gpus) for h in t.hosts) == gpus
    assert all(h.gpus[0].model == "NVIDIA H100 80GB HBM3" and len(h.gpus) == 8 for h in t.hosts)
    assert {h.gpus[0].nvlink_domain for h in t.hosts} == {h.name for h in t.hosts}  # one NVLink domain per host
    switches = {s.guid for s in t.switches}
    host_links = [ln for ln in t.links if not {ln.a.guid, ln.b.guid} <= switches]
    assert len(host_links) + UFM_CABLES == node_cables
    assert len(t.links) - len(host_links) == leaf_cables
    assert all(s.radix == 64 and s.sharp and s.model == gen.QUANTUM2 for s in t.switches)
    assert all(ln.gbps == NDR for ln in t.links)
    assert len(ix.leaf_groups()) == sus  # one leaf per rail per SU: an SU is a leaf group
    assert all(len(g.switches) == 8 for g in ix.leaf_groups())
    cas = Counter(c.host for c in t.cas)
    assert set(cas.values()) == {8}
    assert sorted({c.name for c in t.cas}) == [f"mlx5_{r}" for r in range(8)]
    assert all(c.name == f"mlx5_{c.rail}" for c in t.cas)


# Larger SuperPODs (RA Table 3, same Quantum-2 fabric): (nodes, leaves, spines, cores); cables 1:1:1
PUBLISHED_LARGE = [(256, 64, 32, 0), (512, 128, 128, 64), (1024, 256, 256, 128)]


@pytest.mark.parametrize(("hosts", "leaves", "spines", "cores"), PUBLISHED_LARGE)
def test_published_superpod_large_counts(hosts: int, leaves: int, spines: int, cores: int) -> None:
    t = gen.rail_optimised(hosts, gpus_per_host=0)
    check_ports(t)
    kinds = Counter(s.name.split("-")[0].rstrip("0123456789") for s in t.switches)
    assert kinds == Counter({k: v for k, v in (("leaf", leaves), ("spine", spines), ("core", cores)) if v})
    switches = {s.guid for s in t.switches}
    names = {s.guid: s.name for s in t.switches}
    between = Counter(
        tuple(sorted(names[g].split("-")[0].rstrip("0123456789") for g in (ln.a.guid, ln.b.guid)))
        for ln in t.links
        if {ln.a.guid, ln.b.guid} <= switches
    )
    assert between[("leaf", "spine")] == hosts * 8
    assert between[("core", "spine")] == (hosts * 8 if cores else 0)


def test_the_same_parameters_give_the_same_guids_and_names() -> None:
    a, b = gen.rail_optimised(40), gen.rail_optimised(40)
    assert a == b and content_hash(a) == content_hash(b)
    assert a.hosts[0].name == "dgx001" and {s.name for s in a.switches} >= {"leaf-su1-r0", "leaf-su2-r7", "spine01"}
    guids = [s.guid for s in a.switches] + [c.guid for c in a.cas]
    assert len(set(guids)) == len(guids)


def test_spec_strings_pick_a_generator_and_its_parameters() -> None:
    from ibpool_core.fabric.generators import generate, parse_spec

    assert parse_spec("rail_optimised:hosts=16, rails=8") == ("rail_optimised", {"hosts": 16, "rails": 8})
    assert len(generate("single_switch:hosts=4").hosts) == 4
    for bad, message in (
        ("warp_drive", "unknown generator"),
        ("single_switch:hosts", "key=value"),
        ("single_switch:legs=3", "single_switch"),
    ):
        with pytest.raises(ValueError, match=message):
            generate(bad)


def test_hosts_can_be_renamed_to_the_node_agents_names() -> None:
    from ibpool_core.fabric.generators import generate
    from ibpool_core.fabric.model import rename_hosts

    t = generate("rail_optimised:hosts=4")
    renamed = rename_hosts(t, {h.name: f"node-{i:03d}" for i, h in enumerate(t.hosts, 1)})
    assert [h.name for h in renamed.hosts] == ["node-001", "node-002", "node-003", "node-004"]
    assert {c.host for c in renamed.cas} == {h.name for h in renamed.hosts}
