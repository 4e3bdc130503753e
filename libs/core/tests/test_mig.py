import pytest
from hypothesis import given
from hypothesis import strategies as st

from ibpool_core.pool.mig import MIG_PROFILES, MigError, MigInstance, is_valid, place, profile_of

H100 = "NVIDIA H100 80GB HBM3"


def test_h100_profiles_and_their_shares() -> None:
    assert set(MIG_PROFILES[H100]) == {"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}
    assert profile_of(H100, "7g.80gb").milli == 1000 and profile_of(H100, "1g.10gb").milli == 142


def test_known_layouts() -> None:
    ok = [
        [MigInstance(profile="7g.80gb", start=0)],
        [MigInstance(profile="4g.40gb", start=0), MigInstance(profile="3g.40gb", start=4)],
        [MigInstance(profile="3g.40gb", start=0), MigInstance(profile="3g.40gb", start=4)],
        [MigInstance(profile="1g.10gb", start=s) for s in range(7)],
        [
            MigInstance(profile="2g.20gb", start=0),
            MigInstance(profile="2g.20gb", start=2),
            MigInstance(profile="3g.40gb", start=4),
        ],
    ]
    bad = [
        [MigInstance(profile="4g.40gb", start=4)],  # 4g only at 0
        [MigInstance(profile="4g.40gb", start=0), MigInstance(profile="4g.40gb", start=0)],
        [MigInstance(profile="1g.10gb", start=7)],  # slice 7 only for 1g.20gb@6 or 7g
        [MigInstance(profile="3g.40gb", start=0), MigInstance(profile="1g.10gb", start=2)],
    ]
    assert all(is_valid(H100, layout) for layout in ok)
    assert not any(is_valid(H100, layout) for layout in bad)


def test_place_fills_then_refuses() -> None:
    layout: list[MigInstance] = []
    for _ in range(7):
        inst = place(H100, layout, "1g.10gb")
        assert inst is not None
        layout.append(inst)
    assert place(H100, layout, "1g.10gb") is None and is_valid(H100, layout)


def test_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(MigError, match=r"1g\.10gb"):
        profile_of(H100, "9g.90gb")


@given(st.lists(st.sampled_from(sorted(MIG_PROFILES[H100])), max_size=12))
def test_placing_greedily_always_keeps_the_layout_valid(profiles: list[str]) -> None:
    layout: list[MigInstance] = []
    for name in profiles:
        inst = place(H100, layout, name)
        if inst is not None:
            layout.append(inst)
        assert is_valid(H100, layout)
