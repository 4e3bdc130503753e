"""MIG (Multi-Instance GPU) profiles and the placement rules of which profiles fit together.

A MIG-capable GPU has 8 memory slices and 7 compute slices. A GPU instance of a profile occupies
a contiguous run of memory slices starting at one of the profile's allowed positions (NVIDIA's
MIG user guide, "Supported MIG profiles" and "placements" tables for A100 and H100), and some
compute slices. A layout is valid when no two instances share a memory slice and at most 7
compute slices are used. The 80 GB parts have the same geometry as the 40 GB A100, with twice
the memory per slice.
"""

from __future__ import annotations

import msgspec

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


class MigProfile(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    compute_slices: int
    memory_slices: int
    memory_mib: int
    placements: tuple[int, ...]

    @property
    def milli(self) -> int:
        """The compute share of the whole GPU, as the pool counts it (1000 = all 7 slices)."""
        return self.compute_slices * 1000 // COMPUTE_SLICES


def _profiles(slice_gb: int, total_mib: int) -> dict[str, MigProfile]:
    per_slice = total_mib // MEMORY_SLICES
    rows = [  # (name suffix compute g, memory slices, placements)
        (1, 1, (0, 1, 2, 3, 4, 5, 6)),
        (1, 2, (0, 2, 4, 6)),
        (2, 2, (0, 2, 4)),
        (3, 4, (0, 4)),
        (4, 4, (0,)),
        (7, 8, (0,)),
    ]
    out = {}
    for g, mem, placements in rows:
        name = f"{g}g.{mem * slice_gb}gb"
        out[name] = MigProfile(
            name=name, compute_slices=g, memory_slices=mem, memory_mib=mem * per_slice, placements=placements
        )
    return out


# GPU model -> profile name -> profile. Names as nvidia-smi prints them.
MIG_PROFILES: dict[str, dict[str, MigProfile]] = {
    "NVIDIA A100-SXM4-40GB": _profiles(5, 40960),
    "NVIDIA A100-SXM4-80GB": _profiles(10, 81920),
    "NVIDIA H100 80GB HBM3": _profiles(10, 81559),
}


class MigInstance(msgspec.Struct, frozen=True, kw_only=True):
    profile: str
    start: int


class MigError(ValueError):
    """A profile that does not exist for the model, or an instance that does not fit the layout."""


def profile_of(model: str, name: str) -> MigProfile:
    try:
        return MIG_PROFILES[model][name]
    except KeyError:
        known = ", ".join(MIG_PROFILES.get(model, {})) or "none (not MIG-capable here)"
        raise MigError(f"no MIG profile {name!r} on {model}; known: {known}") from None


def compute_milli(name: str) -> int | None:
    """The compute share (`MigProfile.milli`) of profile `name`, the same on every model that has it
    (its compute slices are the name's first number); None when no model has it."""
    for profiles in MIG_PROFILES.values():
        if name in profiles:
            return profiles[name].milli
    return None


def occupied(model: str, layout: list[MigInstance]) -> tuple[set[int], int]:
    """Memory slices used and compute slices used by a layout."""
    memory: set[int] = set()
    compute = 0
    for inst in layout:
        p = profile_of(model, inst.profile)
        memory.update(range(inst.start, inst.start + p.memory_slices))
        compute += p.compute_slices
    return memory, compute


def is_valid(model: str, layout: list[MigInstance]) -> bool:
    memory_seen: set[int] = set()
    compute = 0
    for inst in layout:
        p = profile_of(model, inst.profile)
        if inst.start not in p.placements:
            return False
        span = set(range(inst.start, inst.start + p.memory_slices))
        if span & memory_seen:
            return False
        memory_seen |= span
        compute += p.compute_slices
    return compute <= COMPUTE_SLICES


def free_placements(model: str, layout: list[MigInstance], profile: str) -> list[int]:
    """Start positions where one more instance of `profile` fits next to `layout`."""
    p = profile_of(model, profile)
    memory, compute = occupied(model, layout)
    if compute + p.compute_slices > COMPUTE_SLICES:
        return []
    return [s for s in p.placements if not set(range(s, s + p.memory_slices)) & memory]


def place(model: str, layout: list[MigInstance], profile: str) -> MigInstance | None:
    """The first position for `profile` that keeps the layout valid, or None.

    Lowest start first keeps the high slices free, where the larger profiles' only other
    placements are (3g at 4), so single-slice instances do not fragment the GPU needlessly.
    """
    starts = free_placements(model, layout, profile)
    return MigInstance(profile=profile, start=starts[0]) if starts else None
