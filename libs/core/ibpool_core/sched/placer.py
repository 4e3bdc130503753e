"""Where a job goes inside one scheduling cycle: a scratch free-capacity view and the `Placer` protocol.

`FreeView` is the cycle's private, mutable copy of `FreeCapacity.free`, bucketed by free GPU count so
that "does a job of g GPUs fit anywhere?" costs O(GPUs per host), not O(hosts). The default
`LeafPlacer` is leaf-aware; the full filter/score plugin framework can be adapted to `Placer` later.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Protocol

from .jobs import FreeCapacity, Job, host_shares

Placement = list[tuple[int, int]]  # (host index, GPUs) per gang member


class FreeView:
    """Free GPUs per host, with hosts bucketed by their free count and grouped by leaf.

    Invariant: host h is in `by_free[free[h]]` and 0 <= free[h] <= capacity[h]; each bucket lists
    its hosts in increasing index (so what a placer reads of a bucket does not depend on the view's
    history). Only `take`, `give`, `set_free` and `rollback` change the free counts. `capacity`:
    each host's GPUs (default: `max_gpus` for every host). `journal`: while not None, every change
    is written to it (host, free before), and `rollback()` undoes them: a view kept from cycle to
    cycle lends itself to one cycle and is given back as it was, in the work of that cycle's changes.
    """

    __slots__ = ("by_free", "capacity", "free", "journal", "leaf_of", "leaves", "total_free")

    def __init__(self, free: list[int], leaf_of: list[int], max_gpus: int, capacity: list[int] | None = None) -> None:
        self.free = list(free)
        self.leaf_of = leaf_of
        self.capacity = capacity if capacity is not None else [max_gpus] * len(self.free)
        self.by_free: list[list[int]] = [[] for _ in range(max_gpus + 1)]
        leaves: dict[int, list[int]] = {}
        for h, f in enumerate(self.free):
            self.by_free[f].append(h)
            leaves.setdefault(leaf_of[h], []).append(h)
        self.leaves = leaves
        self.total_free = sum(self.free)
        self.journal: list[tuple[int, int]] | None = None

    @classmethod
    def of(cls, cluster: FreeCapacity) -> FreeView:
        return cls(cluster.free, cluster.leaf_of, max(cluster.capacity, default=0), cluster.capacity)

    def copy(self) -> FreeView:
        other = FreeView.__new__(FreeView)
        other.free = list(self.free)
        other.leaf_of = self.leaf_of
        other.capacity = self.capacity
        other.by_free = [list(b) for b in self.by_free]
        other.leaves = self.leaves
        other.total_free = self.total_free
        other.journal = None
        return other

    def hosts_with_at_least(self, gpus: int) -> int:
        return sum(len(b) for b in self.by_free[gpus:])

    def set_free(self, host: int, free: int) -> None:
        """`host` has `free` GPUs free (0 <= free <= its capacity)."""
        f = self.free[host]
        if f == free:
            return
        if self.journal is not None:
            self.journal.append((host, f))
        bucket = self.by_free[f]
        del bucket[bisect_left(bucket, host)]
        insort(self.by_free[free], host)
        self.free[host] = free
        self.total_free += free - f

    def take(self, host: int, gpus: int) -> None:
        self.set_free(host, self.free[host] - gpus)

    def give(self, host: int, gpus: int) -> None:
        """`gpus` come free on `host`, up to its capacity: a running job whose GPUs the pool already
        shows free (its allocation ended, its exit not yet handled) frees nothing more."""
        self.set_free(host, min(self.free[host] + gpus, self.capacity[host]))

    def apply(self, placement: Placement) -> None:
        for host, gpus in placement:
            self.take(host, gpus)

    def rollback(self) -> None:
        """Undo every change since `journal` was set to an empty list; the journal is left empty."""
        journal = self.journal
        if not journal:
            return
        self.journal = None
        for host, f in reversed(journal):
            self.set_free(host, f)
        journal.clear()
        self.journal = journal


class Placer(Protocol):
    """Chooses hosts for one job on a free view.

    Contract: return None, or one (host, GPUs) per gang member such that every host has that many
    GPUs free in `view` and the GPUs sum to `job.gpus` — the whole gang or nothing. `max_leaves` caps
    the number of distinct leaves the placement may span (None: no cap). Must not mutate `view`.
    """

    def place(self, view: FreeView, job: Job, max_leaves: int | None) -> Placement | None: ...


def min_leaf_span(nodes: int, hosts_per_leaf: int) -> int:
    """The fewest leaves a gang of `nodes` hosts can span."""
    return max(1, -(-nodes // max(1, hosts_per_leaf)))


class LeafPlacer:
    """Best fit on one host; gangs on the fewest leaves.

    A single-host job takes the host with the fewest free GPUs that still fits (lowest index on
    ties), which keeps whole hosts free for gangs. A gang needs `nodes` hosts each with its share
    free; it goes to the single leaf with the fewest eligible hosts that can hold it (best fit), else
    to leaves taken in decreasing number of eligible hosts until the gang is complete (fewest leaves).
    """

    def place(self, view: FreeView, job: Job, max_leaves: int | None) -> Placement | None:
        if job.gpus > view.total_free:
            return None
        if job.hosts <= 1:
            by_free = view.by_free
            for f in range(job.gpus, len(by_free)):
                if by_free[f]:
                    return [(by_free[f][0], job.gpus)]
            return None
        shares = host_shares(job)
        need = shares[0]  # the largest share: every member host must hold it (shares differ by at most 1)
        if view.hosts_with_at_least(need) < job.hosts:
            return None
        eligible_by_leaf: list[tuple[int, int, list[int]]] = []
        free = view.free
        for leaf, hosts in view.leaves.items():
            eligible = [h for h in hosts if free[h] >= need]
            if eligible:
                eligible_by_leaf.append((len(eligible), leaf, eligible))
        fitting = [e for e in eligible_by_leaf if e[0] >= job.hosts]
        if fitting:
            chosen = min(fitting)[2]
            chosen.sort(key=lambda h: (free[h], h))
            hosts = chosen[: job.hosts]
        else:
            eligible_by_leaf.sort(key=lambda e: (-e[0], e[1]))
            hosts = []
            for used, (_, _, eligible) in enumerate(eligible_by_leaf, start=1):
                if max_leaves is not None and used > max_leaves:
                    return None
                eligible.sort(key=lambda h: (free[h], h))
                hosts.extend(eligible[: job.hosts - len(hosts)])
                if len(hosts) == job.hosts:
                    break
        return list(zip(hosts, shares, strict=True))


def leaves_spanned(placement: Placement, leaf_of: list[int]) -> int:
    return len({leaf_of[h] for h, _ in placement})
