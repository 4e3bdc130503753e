"""SHARP trees as a bounded resource (`sharp.SharpTrees`): one tree per shared rail, joined by the
lowest SHARP switch above the gang's leaves, within the per-cable / per-switch / subnet limits."""

from __future__ import annotations

import pytest

from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.index import FabricIndex
from ibpool_core.sched.sharp import SHARP_NCCL_ENV, SharpDecision, SharpLimits, SharpTree, SharpTrees

# 16 DGX in 4 scalable units of 4 (8 rails), two tiers: what `make run` uses.
FABRIC = FabricIndex(generate("rail_optimised:hosts=16,su_size=4"))
CAPABLE = SharpDecision(
    enabled=True, reason="every switch of the covering subtree is SHARP-capable", env=SHARP_NCCL_ENV
)
SU1 = ["dgx001", "dgx002"]
SU1_OTHERS = ["dgx003", "dgx004"]
TWO_SUS = ["dgx001", "dgx005"]


def tier_names(tree: SharpTree) -> set[int]:
    return {FABRIC.switch_tier(s) for s in tree.switches}


def test_a_gang_under_one_unit_holds_a_tree_on_each_rail_leaf_only() -> None:
    trees = SharpTrees(FABRIC, SharpLimits())
    tree = trees.plan(SU1)
    assert isinstance(tree, SharpTree)
    assert tree.trees == 8 and len(tree.switches) == 8 and tier_names(tree) == {1}
    assert len(tree.cables) == 16  # each member's cable on each rail
    assert trees.plan(SU1) == tree  # deterministic


def test_a_gang_across_units_joins_each_rails_leaves_at_a_spine() -> None:
    tree = SharpTrees(FABRIC, SharpLimits()).plan(TWO_SUS)
    assert isinstance(tree, SharpTree)
    assert tree.trees == 8 and tier_names(tree) == {1, 2}
    spines = [s for s in tree.switches if FABRIC.switch_tier(s) == 2]
    assert 1 <= len(spines) <= 8


@pytest.mark.parametrize(
    ("name", "limits", "first", "second", "second_gets_sharp", "why"),
    [
        ("per link: two gangs on other hosts of one leaf both get trees", SharpLimits(), SU1, SU1_OTHERS, True, ""),
        ("per link: one host's cable carries one tree", SharpLimits(), SU1, SU1, False, "carries a SHARP tree"),
        (
            "per switch (Quantum HDR): one tree per leaf",
            SharpLimits(per="switch"),
            SU1,
            SU1_OTHERS,
            False,
            "runs its limit of SHARP trees (1 tree per switch)",
        ),
        (
            "per switch, two trees each",
            SharpLimits(per="switch", trees_per_switch=2),
            SU1,
            SU1_OTHERS,
            True,
            "",
        ),
        ("subnet limit", SharpLimits(max_trees=8), SU1, SU1_OTHERS, False, "runs 8 SHARP trees of at most 8"),
    ],
)
def test_the_second_gang_gets_trees_only_while_they_have_room(
    name: str, limits: SharpLimits, first: list[str], second: list[str], second_gets_sharp: bool, why: str
) -> None:
    trees = SharpTrees(FABRIC, limits)
    one = trees.reserve(first, CAPABLE)
    assert one.enabled and one.tree is not None and one.env == SHARP_NCCL_ENV, name
    two = trees.reserve(second, CAPABLE)
    assert two.enabled is second_gets_sharp, name
    if not second_gets_sharp:
        assert two.env == {} and two.tree is None and why in two.reason, (name, two.reason)


def test_trees_held_by_running_jobs_count_and_end_with_them() -> None:
    limits = SharpLimits(per="switch")
    held = SharpTrees(FABRIC, limits).plan(SU1)
    assert isinstance(held, SharpTree)
    busy = SharpTrees(FABRIC, limits, held=[held])
    assert not busy.reserve(SU1_OTHERS, CAPABLE).enabled
    free_again = SharpTrees(FABRIC, limits, held=[])  # the holder ended: its trees are no longer counted
    assert free_again.reserve(SU1_OTHERS, CAPABLE).enabled


def test_spine_trees_run_out_per_switch_and_the_reason_says_so() -> None:
    """Per switch, every cross-unit gang needs a spine per rail: 16 spines, 8 rails each: two fit."""
    trees = SharpTrees(FABRIC, SharpLimits(per="switch"))
    got = [trees.reserve([f"dgx{a:03d}", f"dgx{b:03d}"], CAPABLE) for a, b in [(1, 5), (9, 13), (2, 6)]]
    assert [d.enabled for d in got] == [True, True, False]
    assert "SHARP" in got[2].reason


def test_a_decision_without_sharp_passes_through() -> None:
    off = SharpDecision(enabled=False, reason="the job opted out of SHARP (wants_sharp=false)")
    assert SharpTrees(FABRIC, SharpLimits()).reserve(SU1, off) is off


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="trees_per_link"):
        SharpLimits(trees_per_link=0)
