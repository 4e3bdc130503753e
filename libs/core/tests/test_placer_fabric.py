"""policy_placer with a fabric: gangs under one leaf group, remote grants nearest first within the hop limit,
and the pool's fragmentation measured against the mix the placer saw."""

from __future__ import annotations

import copy

import pytest

from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.model import rename_hosts
from ibpool_core.fabric.view import FabricView, NoFabric, fabric_state
from ibpool_core.pool import allocate as al
from ibpool_core.pool.ledger import Ledger, apply
from ibpool_core.pool.placement import PlacementRequest, first_fit
from ibpool_core.pool.policies import POLICIES
from ibpool_core.pool.policy_placer import policy_placer
from ibpool_core.pool.pool_fragmentation import measure_fragmentation
from libs.core.tests.pool_builders import H100, T0, a, node, pool, propose, request

# Two leaves of four hosts (a 2-tier fat-tree of radix 8): h1..h4 under leaf group 0, h5..h8 under 1.
# Same leaf: 2 hops; across the spine: 4.
HOSTS = [f"h{i}" for i in range(1, 9)]


def fabric() -> FabricView:
    t = generate("fat_tree_2tier:hosts=8,radix=8")
    t = rename_hosts(t, {h.name: HOSTS[i] for i, h in enumerate(t.hosts)})
    return FabricView(fabric_state(t, version=1, origin="test"))


def leaf_of(view: FabricView, node_ids: set[str]) -> set[str | None]:
    return {view.leaf_group(n) for n in node_ids}


def busy(ledger_nodes: int, *node_ids: str) -> list[al.Input]:
    """One GPU of each node granted to someone else."""
    return [propose(f"busy-{n}", a(n, 0), version=ledger_nodes) for n in node_ids]


def gang_nodes(ledger: Ledger, place: al.GpuPlacer, hosts: int = 2) -> set[str]:
    d = al.decide(ledger, request("g", "gang", gpus=2, hosts=hosts), T0, place=place)
    assert d.rejection is None, d.rejection
    return {g.node_id for g in d.granted}


def test_fabric_view_answers_hops_and_leaf_groups() -> None:
    view = fabric()
    assert view.hops("h1", "h2") == 2 and view.hops("h1", "h5") == 4 and view.hops("h3", "h3") == 0
    assert view.leaf_group("h1") == view.leaf_group("h4") != view.leaf_group("h5")
    assert view.leaf_group("nowhere") is None
    with pytest.raises(KeyError):
        view.hops("h1", "nowhere")
    with pytest.raises(NoFabric):
        FabricView().hops("h1", "h2")
    about = view.about
    assert about is not None and (about.hosts, about.leaf_groups, about.version) == (8, 2, 1)
    assert not view.wants(1, about.content_hash)  # the same topology again
    assert view.wants(2, "other") and not view.wants(0, "older")


# h1..h3 have a GPU taken: only h4 of leaf group 0 is whole, every host of group 1 is.
SPLIT = pool(*(node(h) for h in HOSTS), *busy(8, "h1", "h2", "h3"))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_gang_goes_under_one_leaf_where_first_fit_spans_two(name: str) -> None:
    view = fabric()
    ff = gang_nodes(SPLIT, first_fit)
    assert ff == {"h4", "h5"} and len(leaf_of(view, ff)) == 2
    placed = gang_nodes(SPLIT, policy_placer(name, view))
    assert leaf_of(view, placed) == {view.leaf_group("h5")}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_gang_takes_the_tightest_leaf_that_holds_it(name: str) -> None:
    """Group 0 has two whole hosts, group 1 four: the gang of two fills group 0, group 1 stays whole."""
    view = fabric()
    ledger = pool(*(node(h) for h in HOSTS), *busy(8, "h1", "h2"))
    assert gang_nodes(ledger, policy_placer(name, view)) == {"h3", "h4"}
    # A gang of three fits only group 1.
    assert leaf_of(view, gang_nodes(ledger, policy_placer(name, view), hosts=3)) == {view.leaf_group("h5")}


def test_gang_without_a_fabric_is_first_fit() -> None:
    assert gang_nodes(SPLIT, policy_placer("fgd+", FabricView())) == gang_nodes(SPLIT, first_fit)
    assert gang_nodes(SPLIT, policy_placer("fgd+")) == {"h4", "h5"}


def test_gang_spans_the_fewest_leaves_when_no_leaf_holds_it() -> None:
    view = fabric()
    placed = gang_nodes(SPLIT, policy_placer("fgd+", view), hosts=5)
    assert len(placed) == 5 and len(leaf_of(view, placed)) == 2
    rejected = al.decide(SPLIT, request("g", "gang", gpus=2, hosts=6), T0, place=policy_placer("fgd+", view))
    assert rejected.rejection is not None and rejected.rejection.reason == "would_exceed_capacity"


def test_a_node_the_fabric_does_not_have_never_joins_a_gang() -> None:
    """No fabric path is known to it (the scheduler's placement rule, which the allocator shares)."""
    view = fabric()
    ledger = pool(node("h1"), node("h2"), node("stray1"), node("stray2"))
    assert gang_nodes(ledger, policy_placer("fgd+", view)) == {"h1", "h2"}
    # Only h1 of the fabric is whole: the two strays do not make up the gang.
    short = pool(node("h1"), node("h2"), node("stray1"), node("stray2"), *busy(4, "h2"))
    d = al.decide(short, request("g", "gang", gpus=2, hosts=2), T0, place=policy_placer("fgd+", view))
    assert d.rejection is not None and d.rejection.reason == "would_exceed_capacity"


def remote(
    ledger: Ledger, client: str, place: al.GpuPlacer, view: FabricView, max_hops: int, **kw: object
) -> al.Decision:
    cmd = request("r", "remote", client=client, **({"milli": 300} | kw))
    return al.decide(ledger, cmd, T0, place=place, hops=view.hops, config=al.AllocatorConfig(max_remote_hops=max_hops))


# The client h1 has no GPU in the pool; h2 (same leaf) is nearly full, h5..h8 (across the spine) are
# empty and first in ledger order, so first fit would serve from there.
REMOTE = pool(
    *(node(h) for h in HOSTS[4:] + HOSTS[1:4]), *busy(7, "h2"), propose("busy-h2b", a("h2", 1, milli=500), version=7)
)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_remote_grant_goes_to_the_nearest_node_and_records_the_distance(name: str) -> None:
    view = fabric()
    d = remote(REMOTE, "h1", policy_placer(name, view), view, 4)
    assert d.rejection is None, d.rejection
    (g,) = d.granted
    assert view.leaf_group(g.node_id) == view.leaf_group("h1") and g.hops == 2 and g.client_node_id == "h1"
    after = copy.deepcopy(REMOTE)
    apply(after, d.events)
    assert after.allocations["cmd-r"].hops == 2


def test_remote_grant_beyond_the_hop_limit_is_rejected() -> None:
    view = fabric()
    ledger = pool(*(node(h) for h in HOSTS[4:]))  # only hosts across the spine, 4 hops from h1
    place = policy_placer("fgd+", view)
    within = remote(ledger, "h1", place, view, 4, milli=1000, gpus=2)
    assert within.rejection is None and within.granted[0].hops == 4
    beyond = remote(ledger, "h1", place, view, 2)
    assert beyond.rejection is not None and beyond.rejection.reason == "invalid"
    assert "4 hops" in beyond.rejection.detail and "over the limit of 2" in beyond.rejection.detail


def test_remote_grant_without_a_fabric_is_rejected_saying_so() -> None:
    empty = FabricView()
    d = remote(REMOTE, "h1", policy_placer("fgd+", empty), empty, 4)
    assert d.rejection is not None and d.rejection.reason == "invalid"
    assert "has none" in d.rejection.detail


def test_remote_placer_falls_back_to_farther_nodes_when_the_near_ones_are_full() -> None:
    view = fabric()
    ledger = pool(*(node(h) for h in HOSTS[1:]), *busy(7, "h2", "h3", "h4"))
    full = copy.deepcopy(ledger)
    for n in ("h2", "h3", "h4"):
        apply(full, al.decide(full, propose(f"more-{n}", a(n, 1), version=full.version), T0).events)
    want = PlacementRequest(
        request=request("r", "remote", client="h1", milli=300).request,
        nodes=tuple(full.nodes),
        client_node_id="h1",
    )
    got = policy_placer("best-fit", view)(full, want)
    assert got is not None and view.hops("h1", got[0].node_id) == 4


def test_fragmentation_is_partial_free_before_any_request_then_fgd_for_the_mix_seen() -> None:
    ledger = copy.deepcopy(pool(node("n1"), node("n2")))
    place = policy_placer("best-fit")
    first = place.fragmentation(ledger)
    assert first.measure == "partial_free" and first.milli == {H100: 0} and first.free_milli == {H100: 4000}
    for i in range(2):
        apply(ledger, al.decide(ledger, request(f"j{i}", "fraction", milli=400), T0, place=place).events)
    # best fit packs both on one GPU: 200 milli left there, which a 400-milli task cannot use.
    seen = place.fragmentation(ledger)
    assert seen.measure == "fgd" and seen.task_types == 1
    assert seen.milli == {H100: 200} and seen.free_milli == {H100: 3200}
    assert measure_fragmentation(ledger).milli == {H100: 200}  # partial free: the same GPU here
    # For a mix of 2-GPU tasks only, n1 (one whole GPU, one with 200 free) is all fragment.
    fgd = policy_placer("fgd")
    apply(ledger, al.decide(ledger, request("w", "whole", gpus=2), T0, place=fgd).events)
    assert fgd.fragmentation(ledger).milli == {H100: 1200}
