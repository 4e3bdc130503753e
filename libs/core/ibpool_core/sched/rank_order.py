"""Rank order of a gang: hosts ordered so that ring and tree neighbours are close on the fabric.

NCCL builds its rings in rank order (rank r talks to r-1 and r+1, and the last to the first) and
its double binary trees over the same order, so the order of the hosts decides which hosts
exchange data. The order here is a depth-first walk of the fabric's subtree hierarchy: hosts are
sorted by their level-L subtree, then their level-(L-1) subtree, ... down to their level-1 leaf
group, then the leaf they reach on their first rail, then by name. Consequences:

* hosts under the same leaf are adjacent, so a ring crosses a leaf boundary once per leaf group
  it enters (the fewest possible crossings: each group is one contiguous run);
* leaf groups under the same spine-level subtree are adjacent, so the ring climbs to the core
  tier only between pods, once per pod boundary;
* a tree built over contiguous rank ranges keeps each subtree of the fabric in one branch.

Subtree indices are ordered by first host name (see `FabricIndex.subtrees`), so the walk is
deterministic; ties inside a leaf go by host name, which is how operators number their racks.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..fabric.index import FabricIndex


def rank_key(index: FabricIndex, host: str) -> tuple[object, ...]:
    """The sort key of `host` in the depth-first walk (top level first, then leaf, then name).
    A host in no subtree (no cabled adapter) sorts after every cabled host. KeyError if unknown."""
    parts: list[int] = []
    for level in range(index.levels, 0, -1):
        sub = index.subtree_of(host, level)
        parts.append(sub.index if sub is not None else 1 << 30)
    rails = index.rails(host)
    leaf = index.leaf_of(host, rails[0]) if rails else None
    return (*parts, leaf or "~", host)


def rank_order(index: FabricIndex, hosts: Iterable[str]) -> list[str]:
    """`hosts` in rank order (see the module docstring): leaf-mates adjacent, subtree-mates adjacent.
    Pure; O(len(hosts) * levels). KeyError for a host the index does not know."""
    return sorted(hosts, key=lambda h: rank_key(index, h))


def leaf_boundaries(index: FabricIndex, ranked: list[str]) -> int:
    """How many times a ring over `ranked` (wrapping around) moves between two different leaf
    groups; a contiguous order of k groups gives k (or 0 for one group)."""
    if len(ranked) < 2:
        return 0
    groups = [index.subtree_of(h, 1) for h in ranked] if index.levels else [None] * len(ranked)
    ids = [g.index if g is not None else -1 for g in groups]
    changes = sum(1 for a, b in zip(ids, ids[1:] + ids[:1], strict=True) if a != b)
    return changes
