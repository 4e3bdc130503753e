"""The placement framework: gang choice by leaf groups, SHARP, rank order, all-or-nothing reserve/permit,
profile config errors. Fabrics come from the generators (small: a test runs in milliseconds)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibpool_core.fabric import generators as gen
from ibpool_core.fabric.index import FabricIndex
from ibpool_core.fabric.model import Topology
from ibpool_core.sched.framework import (
    ClusterView,
    Framework,
    HostState,
    PermitVerdict,
    PlacementAsk,
    PluginRef,
    ProfileConfig,
    Registry,
    build_profile,
)
from ibpool_core.sched.plugins import default_registry
from ibpool_core.sched.rank_order import leaf_boundaries, rank_order
from ibpool_core.sched.sharp import SHARP_NCCL_ENV

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def view_of(
    topology: Topology, free: Mapping[str, int] | None = None, **kwargs: Any
) -> tuple[FabricIndex, ClusterView]:
    index = FabricIndex(topology)
    free = free or {}
    hosts = [
        HostState(
            name=h.name,
            gpu_model=h.gpus[0].model if h.gpus else "none",
            total_gpus=len(h.gpus),
            free_gpus=free.get(h.name, len(h.gpus)),
        )
        for h in topology.hosts
    ]
    return index, ClusterView(index, hosts, **kwargs)


def names(prefix: str, *numbers: int) -> list[str]:
    return [f"{prefix}{n:03d}" for n in numbers]


def busy(*hosts: str) -> dict[str, int]:
    return dict.fromkeys(hosts, 0)


def framework(config: ProfileConfig | None = None, registry: Registry | None = None) -> Framework:
    return Framework(build_profile(config, registry))


def test_gang_goes_under_the_leaf_that_fits_it_best() -> None:
    # 4 leaves of 4 hosts; leaf 1 has 3 free, leaf 2 has 2 free: a 2-host gang takes leaf 2 (best fit)
    _, view = view_of(gen.fat_tree_2tier(16, radix=8), busy(*names("node", 5, 9, 10)))
    r = framework().place(PlacementAsk(job_id="j", hosts=2, gpus_per_host=8), view, NOW)
    assert r.status == "admitted"
    assert r.hosts == ("node011", "node012")
    assert (r.leaf_groups, r.covering_level) == (1, 1)
    assert dict(view.held("j")) == {"node011": 8, "node012": 8}


def test_gang_spans_the_fewest_leaves_and_rank_order_keeps_leaf_mates_adjacent() -> None:
    index, view = view_of(gen.fat_tree_2tier(16, radix=8), busy(*names("node", 1, 2, 5, 9, 13)))
    # free per leaf: 2, 3, 3, 3 -> 7 hosts need 3 leaves
    r = framework().place(PlacementAsk(job_id="j", hosts=7, gpus_per_host=8), view, NOW)
    assert r.status == "admitted" and len(r.hosts) == 7
    assert r.leaf_groups == 3 and r.covering_level == 2
    assert leaf_boundaries(index, list(r.hosts)) == 3  # each leaf group is one contiguous run
    leaves = [index.leaf_of(h) for h in r.hosts]
    assert leaves == sorted(leaves, key=leaves.index)  # grouped


def test_three_tier_gang_stays_in_one_pod_when_a_pod_holds_it() -> None:
    # 2 pods of 16 hosts; pod 1 is half busy, pod 2 is free: 12 hosts fit only in pod 2 at level 2
    topo = gen.fat_tree_3tier(32, radix=8)
    index, view = view_of(topo, busy(*names("node", *range(1, 9))))
    r = framework().place(PlacementAsk(job_id="j", hosts=12, gpus_per_host=4), view, NOW)
    assert r.status == "admitted"
    assert r.covering_level == 2 and r.leaf_groups == 3
    assert all(index.subtree_of(h, 2).index == 1 for h in r.hosts)  # type: ignore[union-attr]
    assert r.gpus_per_host == (4,) * 12


def test_sharp_is_turned_on_under_a_sharp_subtree_without_being_asked() -> None:
    _, view = view_of(gen.rail_optimised(32, rails=4, su_size=8))
    r = framework().place(PlacementAsk(job_id="j", hosts=12, gpus_per_host=8), view, NOW)
    assert r.status == "admitted" and r.sharp
    assert r.nccl_env == SHARP_NCCL_ENV and r.nccl_env["NCCL_COLLNET_ENABLE"] == "1"
    assert "SHARP-capable" in r.sharp_reason


@pytest.mark.parametrize(
    ("name", "topology", "ask", "reason_part"),
    [
        (
            "fabric without SHARP",
            gen.fat_tree_2tier(16, radix=8, sharp=False),
            PlacementAsk(job_id="j", hosts=2, gpus_per_host=8, wants_sharp=True),
            "no SHARP-capable switch",
        ),
        (
            "job opted out",
            gen.fat_tree_2tier(16, radix=8, sharp=True),
            PlacementAsk(job_id="j", hosts=2, gpus_per_host=8, wants_sharp=False),
            "opted out",
        ),
        (
            "single-node job",
            gen.fat_tree_2tier(16, radix=8, sharp=True),
            PlacementAsk(job_id="j", hosts=1, gpus_per_host=8, wants_sharp=True),
            "single-node",
        ),
    ],
)
def test_sharp_off_says_why(name: str, topology: Topology, ask: PlacementAsk, reason_part: str) -> None:
    _, view = view_of(topology)
    r = framework().place(ask, view, NOW)
    assert r.status == "admitted", name
    assert not r.sharp and r.nccl_env == {}
    assert reason_part in r.sharp_reason, (name, r.sharp_reason)


def sharp_only_on_leaf(topology: Topology, index: FabricIndex, leaf_host: str) -> Topology:
    """The topology with SHARP on the leaf of `leaf_host` only."""
    keep = index.leaf_of(leaf_host)
    switches = [msgspec.structs.replace(s, sharp=s.guid == keep) for s in topology.switches]
    return msgspec.structs.replace(topology, switches=switches)


def test_multi_node_job_prefers_the_sharp_leaf_over_a_better_fit() -> None:
    base = gen.fat_tree_2tier(16, radix=8)
    topo = sharp_only_on_leaf(base, FabricIndex(base), "node009")  # leaf 3 (node009..012) can aggregate
    _, view = view_of(topo, busy(*names("node", 1, 2)))  # leaf 1 (2 free) would be the best fit
    r = framework().place(PlacementAsk(job_id="j", hosts=2, gpus_per_host=8), view, NOW)
    assert r.sharp and set(r.hosts) <= set(names("node", 9, 10, 11, 12))
    # without SHARP wanted, best fit wins again
    r2 = framework().place(PlacementAsk(job_id="k", hosts=2, gpus_per_host=8, wants_sharp=False), view, NOW)
    assert r2.hosts == ("node003", "node004") and not r2.sharp


def test_a_gang_too_big_for_the_sharp_leaf_says_so() -> None:
    base = gen.fat_tree_2tier(16, radix=8)
    topo = sharp_only_on_leaf(base, FabricIndex(base), "node009")
    _, view = view_of(topo)
    r = framework().place(PlacementAsk(job_id="j", hosts=6, gpus_per_host=8), view, NOW)
    assert r.status == "admitted" and not r.sharp
    assert "without SHARP" in r.sharp_reason and "level-2" in r.sharp_reason


@pytest.mark.parametrize(
    ("name", "free", "ask", "want_reason"),
    [
        (
            "required leaf, best leaf short",
            busy(*names("node", 1, 5, 9, 13)),
            PlacementAsk(job_id="j", hosts=4, gpus_per_host=8, topology_level=1, topology_mode="required"),
            "needs 4 hosts with 8 free GPUs under one leaf group (tier 1); the best leaf group has 3",
        ),
        (
            "whole fabric short",
            busy(*names("node", *range(1, 14))),
            PlacementAsk(job_id="j", hosts=4, gpus_per_host=8),
            "needs 4 hosts with 8 free GPUs; 3 in the whole fabric",
        ),
        (
            "model absent",
            {},
            PlacementAsk(job_id="j", hosts=1, gpus_per_host=1, gpu_model="NVIDIA L40S"),
            "needs 1 host with 1 free GPU of NVIDIA L40S; 0 in the whole fabric",
        ),
        (
            "dataset held nowhere",
            {},
            PlacementAsk(job_id="j", hosts=1, gpus_per_host=1, dataset="imagenet", data_locality="required"),
            "data-locality: no host holds dataset 'imagenet'",
        ),
    ],
)
def test_unschedulable_reasons(name: str, free: dict[str, int], ask: PlacementAsk, want_reason: str) -> None:
    _, view = view_of(gen.fat_tree_2tier(16, radix=8), free)
    r = framework().place(ask, view, NOW)
    assert (r.status, r.reason) == ("unschedulable", want_reason), name
    assert not view.jobs_holding()


def test_filter_rejections_are_counted_in_the_reason() -> None:
    topo = gen.fat_tree_2tier(8, radix=8)
    index = FabricIndex(topo)
    hosts = [
        HostState(name=h, gpu_model="NVIDIA H100 80GB HBM3", total_gpus=8, free_gpus=8, health="cordoned")
        for h in index.hosts
    ]
    view = ClusterView(index, hosts)
    r = framework().place(PlacementAsk(job_id="j", hosts=2, gpus_per_host=8), view, NOW)
    assert r.status == "unschedulable"
    assert "8 hosts: node cordoned" in r.reason


def test_required_dataset_places_only_on_holders() -> None:
    holders = names("node", 3, 7, 8, 12)
    _, view = view_of(gen.fat_tree_2tier(16, radix=8), datasets={"ds": holders})
    ask = PlacementAsk(job_id="j", hosts=3, gpus_per_host=8, dataset="ds", data_locality="required")
    r = framework().place(ask, view, NOW)
    assert r.status == "admitted" and set(r.hosts) <= set(holders)
    assert r.leaf_groups == 2  # node007, node008 under leaf 2 plus one more


def test_preferred_dataset_pulls_the_gang_to_its_holders() -> None:
    _, view = view_of(gen.fat_tree_2tier(16, radix=8), datasets={"ds": names("node", 14, 15)})
    ask = PlacementAsk(job_id="j", hosts=2, gpus_per_host=8, dataset="ds")
    r = framework().place(ask, view, NOW)
    assert r.hosts == ("node014", "node015")
    assert r.scores["data-locality"] == 100.0


def test_a_job_is_placed_once_per_view() -> None:
    _, view = view_of(gen.fat_tree_2tier(16, radix=8))
    fw = framework()
    assert fw.place(PlacementAsk(job_id="j", gpus_per_host=2), view, NOW).status == "admitted"
    again = fw.place(PlacementAsk(job_id="j", gpus_per_host=2), view, NOW)
    assert again.status == "rejected" and dict(view.held("j")) != {}


def test_reservations_are_seen_by_later_placements_of_the_cycle() -> None:
    _, view = view_of(gen.fat_tree_2tier(16, radix=8))
    fw = framework()
    results = [fw.place(PlacementAsk(job_id=f"j{i}", hosts=4, gpus_per_host=8), view, NOW) for i in range(5)]
    assert [r.status for r in results] == ["admitted"] * 4 + ["unschedulable"]
    used = [h for r in results for h in r.hosts]
    assert len(used) == len(set(used)) == 16


# ------------------------------------------------------------------- reserve / permit: no partial holds


class FailingReserve:
    """Fails on the listed hosts, holds GPUs elsewhere (as the gpus plugin does)."""

    def __init__(self, fail_on: Sequence[str]) -> None:
        self.fail_on = set(fail_on)

    def reserve(self, ask: PlacementAsk, view: ClusterView, host: str, gpus: int) -> str | None:
        if host in self.fail_on:
            return "injected failure"
        return None if view.hold(ask.job_id, host, gpus) else "no room"

    def unreserve(self, ask: PlacementAsk, view: ClusterView, host: str) -> None:
        view.release(ask.job_id, host)


class ScriptedPermit:
    def __init__(self, verdicts: list[PermitVerdict]) -> None:
        self.verdicts = verdicts

    def permit(self, ask: PlacementAsk, view: ClusterView, hosts: Sequence[str]) -> PermitVerdict:
        return self.verdicts.pop(0) if len(self.verdicts) > 1 else self.verdicts[0]


def registry_with(**plugins: object) -> Registry:
    registry = default_registry()
    for name, plugin in plugins.items():
        registry.register(name, lambda args, p=plugin: p)
    return registry


def test_a_failed_reserve_undoes_every_member() -> None:
    _, view = view_of(gen.fat_tree_2tier(16, radix=8))
    config = ProfileConfig(reserve=(PluginRef(name="failing"),))
    fw = framework(config, registry_with(failing=FailingReserve(["node003"])))
    r = fw.place(PlacementAsk(job_id="j", hosts=4, gpus_per_host=8), view, NOW)
    assert r.status == "unschedulable" and "node003" in r.reason
    assert dict(view.held("j")) == {} and all(view.free(h) == 8 for h in view.hosts)


def test_permit_wait_holds_until_the_deadline_then_releases_everything() -> None:
    _, view = view_of(gen.fat_tree_2tier(16, radix=8))
    waiting = PermitVerdict(kind="wait", reason="dataset still staging", timeout_s=60)
    config = ProfileConfig(permit=(PluginRef(name="gang-barrier"), PluginRef(name="scripted")))
    fw = framework(config, registry_with(scripted=ScriptedPermit([waiting])))
    r = fw.place(PlacementAsk(job_id="j", hosts=3, gpus_per_host=8), view, NOW)
    assert r.status == "waiting" and r.deadline == NOW + dt.timedelta(seconds=60)
    assert len(view.held("j")) == 3
    still = fw.resolve_waiting(view, NOW + dt.timedelta(seconds=30))
    assert [x.status for x in still] == ["waiting"] and len(view.held("j")) == 3
    gone = fw.resolve_waiting(view, NOW + dt.timedelta(seconds=60))
    assert [x.status for x in gone] == ["rejected"] and "timed out" in gone[0].reason
    assert dict(view.held("j")) == {} and view.waiting == {}


def test_permit_wait_turns_into_admission() -> None:
    _, view = view_of(gen.fat_tree_2tier(16, radix=8))
    verdicts = [PermitVerdict(kind="wait", reason="later"), PermitVerdict(kind="allow")]
    config = ProfileConfig(permit=(PluginRef(name="scripted"),), permit_timeout_s=5)
    fw = framework(config, registry_with(scripted=ScriptedPermit(verdicts)))
    r = fw.place(PlacementAsk(job_id="j", hosts=2, gpus_per_host=8), view, NOW)
    assert r.status == "waiting" and r.deadline == NOW + dt.timedelta(seconds=5)
    (done,) = fw.resolve_waiting(view, NOW + dt.timedelta(seconds=1))
    assert done.status == "admitted" and done.hosts == r.hosts and len(view.held("j")) == 2


def test_permit_reject_releases_everything() -> None:
    _, view = view_of(gen.fat_tree_2tier(16, radix=8))
    config = ProfileConfig(permit=(PluginRef(name="scripted"),))
    fw = framework(config, registry_with(scripted=ScriptedPermit([PermitVerdict(kind="reject", reason="quota")])))
    r = fw.place(PlacementAsk(job_id="j", hosts=2, gpus_per_host=8), view, NOW)
    assert (r.status, r.reason) == ("rejected", "scripted: quota")
    assert dict(view.held("j")) == {}


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, int], list[PlacementAsk], list[str], list[str]]:
    hosts = names("node", *range(1, 17))
    free = {h: draw(st.integers(0, 8)) for h in hosts}
    asks = [
        PlacementAsk(
            job_id=f"j{i}",
            hosts=draw(st.integers(1, 6)),
            gpus_per_host=draw(st.sampled_from([1, 2, 4, 8])),
            wants_sharp=draw(st.sampled_from([None, True, False])),
            topology_level=draw(st.sampled_from([None, 1, 2])),
            topology_mode=draw(st.sampled_from(["required", "preferred"])),
        )
        for i in range(draw(st.integers(1, 6)))
    ]
    fail_on = draw(st.lists(st.sampled_from(hosts), max_size=3))
    permits = draw(st.lists(st.sampled_from(["allow", "wait", "reject"]), min_size=len(asks), max_size=len(asks)))
    return free, asks, fail_on, permits


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_a_gang_is_never_partially_reserved(
    scenario: tuple[dict[str, int], list[PlacementAsk], list[str], list[str]],
) -> None:
    free, asks, fail_on, permits = scenario
    index, view = view_of(gen.fat_tree_2tier(16, radix=8), free)
    verdicts = [PermitVerdict(kind=k, reason=k, timeout_s=10) for k in permits]  # type: ignore[arg-type]
    config = ProfileConfig(
        reserve=(PluginRef(name="failing"),), permit=(PluginRef(name="gang-barrier"), PluginRef(name="scripted"))
    )
    fw = framework(config, registry_with(failing=FailingReserve(fail_on), scripted=ScriptedPermit(verdicts)))

    def check() -> None:
        held_total: dict[str, int] = {}
        for ask in asks:
            held = view.held(ask.job_id)
            assert len(held) in (0, ask.hosts), (ask, dict(held))
            assert all(g == ask.gpus_per_host for g in held.values())
            for h, g in held.items():
                held_total[h] = held_total.get(h, 0) + g
        for h in view.hosts:
            assert view.free(h) + held_total.get(h, 0) == free[h]
        # the capacity index agrees with the live free counts
        cap = view.capacity_by_group(None, 1)
        assert cap == [sum(1 for h in g if view.free(h) >= 1) for g in view.group_hosts]

    for ask in asks:
        r = fw.place(ask, view, NOW)
        held = view.held(ask.job_id)
        if r.status in ("admitted", "waiting"):
            assert set(held) == set(r.hosts) and len(r.hosts) == ask.hosts
            assert not set(r.hosts) & set(fail_on)
            assert leaf_boundaries(index, list(r.hosts)) in (0, r.leaf_groups)
            if ask.topology_level == 1 and ask.topology_mode == "required":
                assert r.leaf_groups == 1
        else:
            assert dict(held) == {}
        check()
    fw.resolve_waiting(view, NOW + dt.timedelta(seconds=10))
    check()
    assert view.waiting == {}


# ------------------------------------------------------------------------------------ rank order


def renamed(topology: Topology, seed: int) -> Topology:
    """The topology with its hosts renamed by a seeded permutation, so name order is not fabric order."""
    import random

    old = [h.name for h in topology.hosts]
    new = old[:]
    random.Random(seed).shuffle(new)
    to = dict(zip(old, new, strict=True))
    hosts = [msgspec.structs.replace(h, name=to[h.name]) for h in topology.hosts]
    cas = [msgspec.structs.replace(c, host=to[c.host]) for c in topology.cas]
    return msgspec.structs.replace(topology, hosts=sorted(hosts, key=lambda h: h.name), cas=cas)


SCRAMBLED_3TIER = FabricIndex(renamed(gen.fat_tree_3tier(32, radix=8), seed=7))


@settings(max_examples=40, deadline=None)
@given(st.sets(st.integers(0, 31), min_size=2, max_size=20), st.randoms(use_true_random=False))
def test_rank_order_keeps_every_subtree_contiguous(picked: set[int], rnd: Any) -> None:
    index = SCRAMBLED_3TIER
    hosts = [index.hosts[i] for i in picked]
    rnd.shuffle(hosts)
    ranked = rank_order(index, hosts)
    assert sorted(ranked) == sorted(hosts)
    for level in (1, 2):
        ids = [index.subtree_of(h, level).index for h in ranked]  # type: ignore[union-attr]
        runs = [a for i, a in enumerate(ids) if i == 0 or ids[i - 1] != a]
        assert len(runs) == len(set(ids)), (level, ranked)


def test_rank_order_on_a_rail_optimised_fabric_groups_scalable_units() -> None:
    index = FabricIndex(gen.rail_optimised(32, rails=4, su_size=8))
    hosts = ["dgx017", "dgx002", "dgx025", "dgx009", "dgx001", "dgx018"]
    assert rank_order(index, hosts) == ["dgx001", "dgx002", "dgx009", "dgx017", "dgx018", "dgx025"]
    assert leaf_boundaries(index, rank_order(index, hosts)) == 4


# ------------------------------------------------------------------------------------ profile config


@pytest.mark.parametrize(
    ("name", "config", "message"),
    [
        (
            "unknown plugin",
            {"name": "batch", "filter": [{"name": "fitz"}]},
            "profile 'batch': filter[0]: unknown plugin 'fitz'",
        ),
        ("wrong point", {"score": [{"name": "fits"}]}, "score[0]: plugin 'fits' is not a score plugin"),
        (
            "weight zero",
            {"score": [{"name": "load", "weight": 0}]},
            "score[0]: plugin 'load': weight must be 1..100, not 0",
        ),
        ("weight too big", {"score": [{"name": "load", "weight": 101}]}, "weight must be 1..100, not 101"),
        ("weight on a filter", {"filter": [{"name": "fits", "weight": 3}]}, "only score plugins take a weight"),
        ("listed twice", {"filter": [{"name": "fits"}, {"name": "fits"}]}, "filter[1]: plugin 'fits' is listed twice"),
        ("unknown field", {"name": "x", "filters": []}, "profile 'x': Object contains unknown field `filters`"),
        (
            "weight not int",
            {"score": [{"name": "load", "weight": "heavy"}]},
            "Expected `int`, got `str` - at `$.score[0].weight`",
        ),
        ("bad arg", {"score": [{"name": "load", "args": {"hot": 90}}]}, "plugin 'load': unknown args hot"),
        ("bad arg value", {"score": [{"name": "load", "args": {"hot_c": 30}}]}, "hot_c (30.0) must be above cool_c"),
        ("timeout", {"permit_timeout_s": 0}, "permit_timeout_s must be > 0"),
        ("candidates", {"max_candidates": 0}, "max_candidates must be >= 1"),
    ],
)
def test_bad_profile_config_names_what_and_where(name: str, config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as err:
        build_profile(config)
    assert message in str(err.value), (name, str(err.value))


def test_profile_from_a_plain_mapping() -> None:
    profile = build_profile(
        {"name": "inference", "score": [{"name": "load", "weight": 5}, {"name": "topology", "weight": 1}]}
    )
    assert profile.name == "inference"
    assert [(n, w) for n, _, w in profile.host_scores] == [("load", 5)]
    assert [(n, w) for n, _, w in profile.gang_scores] == [("topology", 1)]
    assert [n for n, _ in profile.filters] == ["fits", "health", "gpu-model", "data-locality"]


def test_placed_gangs_come_back_in_rank_order_even_when_names_are_scrambled() -> None:
    topo = renamed(gen.fat_tree_3tier(32, radix=8), seed=7)
    index, view = view_of(topo)
    r = framework().place(PlacementAsk(job_id="j", hosts=20, gpus_per_host=8), view, NOW)
    assert r.status == "admitted" and r.covering_level == 3
    assert list(r.hosts) == rank_order(index, r.hosts) != sorted(r.hosts)
    for level in (1, 2):
        ids = [index.subtree_of(h, level).index for h in r.hosts]  # type: ignore[union-attr]
        assert len([a for i, a in enumerate(ids) if i == 0 or ids[i - 1] != a]) == len(set(ids))


def test_hosts_missing_from_the_view_are_never_placed() -> None:
    index = FabricIndex(gen.fat_tree_2tier(16, radix=8))
    present = names("node", 1, 2, 3, 6, 7)
    view = ClusterView(
        index,
        [HostState(name=h, gpu_model="NVIDIA H100 80GB HBM3", total_gpus=8, free_gpus=8) for h in present],
        datasets={"ds": names("node", 4, 5, 6, 7)},  # node004, node005 are not in the view
    )
    assert view.dataset_hosts["ds"] == frozenset(names("node", 6, 7))
    fw = framework()
    r = fw.place(PlacementAsk(job_id="a", hosts=2, gpus_per_host=8, dataset="ds", data_locality="required"), view, NOW)
    assert r.hosts == ("node006", "node007")
    r = fw.place(PlacementAsk(job_id="b", hosts=3, gpus_per_host=8), view, NOW)
    assert r.hosts == ("node001", "node002", "node003")
    r = fw.place(PlacementAsk(job_id="c", hosts=1, gpus_per_host=8), view, NOW)
    assert r.status == "unschedulable"
