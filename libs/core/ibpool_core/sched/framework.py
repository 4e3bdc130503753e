"""The scheduler's placement framework: where a job runs, decided by plugins on the live fabric.

Plugin points follow the Kubernetes scheduler framework; each is a small Protocol below whose
docstring is its contract. One placement (`Framework.place`) runs them in this order:

  PreFilter   once per ask: may narrow the candidate hosts (e.g. to the holders of a dataset) or
              reject the ask outright
  Filter      per host: may this host run one member of the job?
  Score       per host (`HostScore`) or per candidate gang (`GangScore`), 0..100, weighted
  Reserve     per chosen host, in rank order: hold its GPUs in the view; Unreserve undoes it
  Permit      once per gang, after every member is reserved: allow, wait (with a timeout) or reject

Gang placement, fast on big fabrics. Scoring every combination of hosts is hopeless at 12,500
hosts, so the gang's host set is chosen by leaf groups (level-1 subtrees of `FabricIndex`) and the
subtrees above them, and Filter/Score run only on the hosts of the groups that are looked at:

1. Capacity bound. `ClusterView` keeps, per leaf group and GPU model, how many hosts have at least
   g free GPUs (updated on every reserve), so an upper bound of the hosts that can take a member
   is one lookup per group. With a PreFilter host set the bound is counted from that set instead.
2. Smallest covering subtree. Go up the levels 1, 2, ... and stop at the first level k where some
   level-k subtree's bound is >= the gang size (a `required` topology level caps k).
3. Candidates. Order the level-k subtrees that pass by: under SHARP when the job wants it, most
   dataset holders when locality is preferred, fewest leaf groups with unhealthy links, then best
   fit (the smallest bound that holds the gang, so big free subtrees stay whole for big gangs).
4. Fill a candidate with the fewest leaf groups: while members are missing, take the smallest
   group that completes the gang if one does, else the largest; a group's bound is replaced by
   its real count (Filter on its hosts) before it is used; inside a group the best-scored hosts
   are taken. Up to `max_candidates` complete candidates are built; if none completes at level k
   the search goes on at k+1.
5. Score each complete candidate (weighted mean of the plugins: host scores averaged over its
   members, gang scores on the whole set) and keep the best; then rank order, SHARP, Reserve, Permit.

A placement is all or nothing: if a Reserve fails or a Permit rejects, every reservation made for
the job is undone before `place` returns; a gang whose Permit says "wait" keeps its reservations
only until its deadline (`Framework.resolve_waiting` unreserves it then). No partial holds.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

from ..fabric.index import FabricIndex, Subtree
from ..fabric.link_health import LinkState
from .rank_order import rank_key
from .sharp import decide_sharp, sharp_wanted

HostHealth = Literal["ready", "cordoned", "draining", "suspect", "failed", "unknown"]
Locality = Literal["required", "preferred"]
_BAD_LINKS: frozenset[str] = frozenset({"degraded", "flapping", "down"})
_LINK_RANK: dict[str, int] = {"up": 0, "degraded": 1, "flapping": 2, "down": 3}


# ------------------------------------------------------------------------------------- inputs


class Telemetry(msgspec.Struct, frozen=True, kw_only=True):
    """A host's latest GPU telemetry. gpu_util and memory_used are fractions 0..1 (mean over its
    GPUs), temperature_c the hottest GPU. Missing telemetry reads as an idle, cool host."""

    gpu_util: float = 0.0
    temperature_c: float = 0.0
    memory_used: float = 0.0


class HostState(msgspec.Struct, frozen=True, kw_only=True):
    """One host as the scheduler sees it at the start of a cycle (free_gpus before this cycle's
    reservations; `ClusterView.free` gives the live figure)."""

    name: str
    gpu_model: str
    total_gpus: int
    free_gpus: int
    health: HostHealth = "ready"
    telemetry: Telemetry = Telemetry()
    datasets: tuple[str, ...] = ()


class PlacementAsk(msgspec.Struct, frozen=True, kw_only=True):
    """What a job needs. `hosts` x `gpus_per_host` (a single-host job: hosts=1, gpus_per_host = its
    GPU count).

    gpu_model         None = any model (members may then land on different models)
    dataset           the dataset the job reads; `data_locality` says whether only holders may run it
    topology_level    the highest subtree level the gang may span (1 = one leaf group); with
                      `topology_mode` "required" nothing wider is placed, "preferred" only scores it
    wants_sharp       True/False, or None = let the scheduler decide (yes for multi-node jobs)
    compute_heavy     the job keeps its GPUs busy: avoid hot and busy hosts
    """

    job_id: str
    gpus_per_host: int
    hosts: int = 1
    gpu_model: str | None = None
    dataset: str | None = None
    data_locality: Locality = "preferred"
    topology_level: int | None = None
    topology_mode: Locality = "preferred"
    wants_sharp: bool | None = None
    compute_heavy: bool = False

    def __post_init__(self) -> None:
        if self.hosts < 1:
            raise ValueError(f"job {self.job_id}: hosts must be >= 1, not {self.hosts}")
        if self.gpus_per_host < 1:
            raise ValueError(f"job {self.job_id}: gpus_per_host must be >= 1, not {self.gpus_per_host}")
        if self.topology_level is not None and self.topology_level < 1:
            raise ValueError(f"job {self.job_id}: topology_level must be >= 1, not {self.topology_level}")


class ClusterView:
    """The cluster for one scheduling cycle: hosts, telemetry, datasets, the fabric and its link
    health, plus the reservations made during the cycle. Built once per cycle (O(hosts)); every
    placement of the cycle reads and reserves on it.

    index        the fabric (`FabricIndex` of the current topology version)
    hosts        one `HostState` per schedulable host; every name must be a host of `index`
    link_state   worst link state per leaf GUID and per host name (from fabric_monitor's verdicts,
                 `ibpool_core.fabric.link_health.LinkState`); absent = "up"
    datasets     dataset -> names of the hosts holding it (the dataset registry), merged with
                 `HostState.datasets`
    off_fabric   False: every host must be a host of `index` (ValueError otherwise). True: a host
                 the fabric does not have (a node the fabric monitor has not discovered) is a
                 group of its own at every level, joined with no other host: it may run a
                 single-host job, never a member of a gang

    Hosts with no cabled adapter (in no leaf group) are kept but never placed.
    Pure data: no I/O, no clock; `waiting` holds gangs whose Permit said wait, with their deadline.
    """

    def __init__(
        self,
        index: FabricIndex,
        hosts: Iterable[HostState],
        *,
        link_state: Mapping[str, LinkState] | None = None,
        datasets: Mapping[str, Collection[str]] | None = None,
        off_fabric: bool = False,
    ) -> None:
        self.index = index
        self.hosts: dict[str, HostState] = {}
        for h in hosts:
            if h.name in self.hosts:
                raise ValueError(f"host {h.name!r} is listed twice")
            self.hosts[h.name] = h
        known = set(index.hosts)
        unknown = sorted(name for name in self.hosts if name not in known)
        if unknown and not off_fabric:
            raise ValueError(f"hosts not in the fabric: {', '.join(unknown[:5])}")
        #: hosts the fabric does not have, each a group (and a subtree at every level) of its own
        self.off_fabric: frozenset[str] = frozenset(unknown)
        self._free: dict[str, int] = {name: h.free_gpus for name, h in self.hosts.items()}
        self._held: dict[str, dict[str, int]] = {}
        self.waiting: dict[str, WaitingGang] = {}

        holders: dict[str, set[str]] = {ds: set(names) for ds, names in (datasets or {}).items()}
        for h in self.hosts.values():
            for ds in h.datasets:
                holders.setdefault(ds, set()).add(h.name)
        #: dataset -> the hosts of this view holding it (registry entries for other hosts are dropped)
        present = self.hosts.keys()
        self.dataset_hosts: dict[str, frozenset[str]] = {ds: frozenset(v & present) for ds, v in holders.items()}

        # leaf groups and, per level, the subtree each group lies in
        levels = max(index.levels, 1) if unknown else index.levels
        self.levels = levels
        groups = index.leaf_groups() if index.levels else []
        self.group_hosts: list[tuple[str, ...]] = [tuple(n for n in g.hosts if n in self.hosts) for g in groups]
        self.group_hosts.extend((name,) for name in unknown)
        self.group_of: dict[str, int] = {}
        for gi, names in enumerate(self.group_hosts):
            for name in names:
                self.group_of[name] = gi
        #: [level][group] -> index of the level-k subtree holding the group (level 0 unused)
        self.group_parent: list[list[int]] = [[]]
        #: [level][subtree] -> the groups in it, in index order
        self.subtree_groups: list[list[list[int]]] = [[]]
        #: [level] -> the level-k subtrees of the fabric (`FabricIndex.subtrees`), then one per
        #: off-fabric host
        self.subtrees: list[list[Subtree]] = [[]]
        #: off-fabric host -> its subtree at level 1 (the same hosts at every level)
        self._off_subtree: dict[str, Subtree] = {}
        for k in range(1, levels + 1):
            fabric_subtrees = index.subtrees(k) if k <= index.levels else []
            parent = [0] * len(self.group_hosts)
            members: list[list[int]] = [[] for _ in fabric_subtrees]
            for gi, g in enumerate(groups):
                sub = index.subtree_of(g.hosts[0], k)
                assert sub is not None  # a leaf group's hosts are cabled
                parent[gi] = sub.index
                members[sub.index].append(gi)
            subtrees = list(fabric_subtrees)
            for i, name in enumerate(unknown):
                gi = len(groups) + i
                own = Subtree(level=k, index=len(subtrees), switches=(), hosts=(name,), sharp=False)
                if k == 1:
                    self._off_subtree[name] = own
                parent[gi] = own.index
                members.append([gi])
                subtrees.append(own)
            self.subtrees.append(subtrees)
            self.group_parent.append(parent)
            self.subtree_groups.append(members)
        #: [level] -> hosts of the largest level-k subtree (0 for level 0)
        self.largest_subtree: list[int] = [0] + [max((len(t.hosts) for t in ts), default=0) for ts in self.subtrees[1:]]
        #: [level] -> hosts of this view in its largest level-k subtree
        self._largest_here: list[int] = [0] + [
            max((sum(len(self.group_hosts[g]) for g in groups) for groups in self.subtree_groups[k]), default=0)
            for k in range(1, levels + 1)
        ]

        # link health: hosts and groups touched by a leaf or host link that is not "up"
        self.host_link: dict[str, LinkState] = {}
        self.bad_groups: set[int] = set()
        if link_state:
            leaf_state: dict[str, LinkState] = {guid: st for guid, st in link_state.items() if st != "up"}
            for name in self.hosts:
                worst: LinkState = link_state.get(name, "up")
                if leaf_state and name not in self.off_fabric:
                    for leaves in index.leaves_of(name).values():
                        for leaf in leaves:
                            leaf_st = leaf_state.get(leaf, "up")
                            if _LINK_RANK[leaf_st] > _LINK_RANK[worst]:
                                worst = leaf_st
                if worst != "up":
                    self.host_link[name] = worst
                    if name in self.group_of:
                        self.bad_groups.add(self.group_of[name])

        # capacity index: [model][g][group] = hosts of the group with that model (None: any model) and
        # at least g free GPUs; one column per g so a placement copies a list instead of summing
        self._max_gpus = max((h.total_gpus for h in self.hosts.values()), default=0)
        n_groups, top = len(self.group_hosts), self._max_gpus
        self._cap: dict[str | None, list[list[int]]] = {None: [[0] * n_groups for _ in range(top + 1)]}
        for name, h in self.hosts.items():
            group = self.group_of.get(name)
            if group is not None:
                cols = self._cap.get(h.gpu_model)
                if cols is None:
                    cols = self._cap[h.gpu_model] = [[0] * n_groups for _ in range(top + 1)]
                for n_free in range(1, min(self._free[name], top) + 1):
                    cols[n_free][group] += 1
                    self._cap[None][n_free][group] += 1
        self._rank_keys: dict[str, tuple[object, ...]] = {}
        self._rails: dict[str, frozenset[int]] = {}
        #: the Filter and HostScore answers of host-local profiles (`Profile.host_local`), per ask
        #: shape (the ask less its job id) and host: (the host's state, its free GPUs, the Filter
        #: reason or None, the scores, their weighted mean), valid while that state and count hold
        self.answers: dict[tuple[object, ...], dict[str, _Answer]] = {}

    def rank_key(self, host: str) -> tuple[object, ...]:
        """`rank_order.rank_key` of `host`, cached for the cycle (an off-fabric host sorts last)."""
        key = self._rank_keys.get(host)
        if key is None:
            if host in self.off_fabric:
                key = (*([1 << 30] * self.index.levels), "~", host)
            else:
                key = rank_key(self.index, host)
            self._rank_keys[host] = key
        return key

    def rails(self, host: str) -> frozenset[int]:
        """`FabricIndex.rails` of `host` as a set, cached for the cycle (none off the fabric)."""
        hit = self._rails.get(host)
        if hit is None:
            hit = self._rails[host] = frozenset() if host in self.off_fabric else frozenset(self.index.rails(host))
        return hit

    def lowest_level_holding(self, nodes: int) -> int:
        """The lowest tier with a group that holds `nodes` hosts of this view (free or not); the top
        tier when none does (1 for a fabric without levels)."""
        for k in range(1, self.levels + 1):
            if self._largest_here[k] >= nodes:
                return k
        return max(self.levels, 1)

    def covering(self, hosts: Sequence[str]) -> Subtree | None:
        """The smallest subtree holding every host of `hosts` (`FabricIndex.covering_subtree`); an
        off-fabric host's own subtree when it is the only one; None when no subtree holds them."""
        if any(h in self.off_fabric for h in hosts):
            return self._off_subtree[hosts[0]] if len(hosts) == 1 else None
        return self.index.covering_subtree(hosts)

    # ------------------------------------------------------------------------- reservations

    def free(self, host: str) -> int:
        """Free GPUs of `host` now: its free_gpus less what this cycle reserved there."""
        return self._free[host]

    def held(self, job_id: str) -> Mapping[str, int]:
        """host -> GPUs reserved for `job_id` in this view (empty if none)."""
        return self._held.get(job_id, {})

    def jobs_holding(self) -> list[str]:
        """Ids of the jobs that hold reservations, in the order they first reserved."""
        return list(self._held)

    def _shift(self, host: str, before: int, after: int) -> None:
        gi = self.group_of.get(host)
        if gi is None:
            return
        top = self._max_gpus
        by_model, by_any = self._cap[self.hosts[host].gpu_model], self._cap[None]
        step = -1 if after < before else 1
        for g in range(max(min(before, after), 0) + 1, min(max(before, after), top) + 1):
            by_model[g][gi] += step
            by_any[g][gi] += step

    def hold(self, job_id: str, host: str, gpus: int) -> bool:
        """Reserve `gpus` more GPUs of `host` for `job_id`; False (and nothing changes) when the host
        is unknown or has fewer free GPUs."""
        free = self._free.get(host)
        if free is None or gpus < 1 or free < gpus:
            return False
        self._free[host] = free - gpus
        self._shift(host, free, free - gpus)
        per = self._held.setdefault(job_id, {})
        per[host] = per.get(host, 0) + gpus
        return True

    def set_free(self, host: str, free: int) -> None:
        """Set the free GPUs of `host` from outside the framework (a caller that keeps its own
        account of free GPUs, e.g. `framework_placer.FrameworkPlacer`), keeping the capacity index
        in step. Reservations held in the view are not touched. KeyError for an unknown host."""
        before = self._free[host]
        if free < 0:
            raise ValueError(f"host {host!r}: free GPUs must be >= 0, not {free}")
        if free != before:
            self._free[host] = free
            self._shift(host, before, free)

    def replace_host(self, state: HostState) -> None:
        """Replace a host's state (telemetry, health, datasets it reports) between placements,
        keeping its free GPUs as the view counts them. The GPU model and count must not change
        (they are in the capacity index: build a new view for that). ValueError otherwise."""
        old = self.hosts.get(state.name)
        if old is None:
            raise ValueError(f"host {state.name!r} is not in the view")
        if old.gpu_model != state.gpu_model or old.total_gpus != state.total_gpus:
            raise ValueError(f"host {state.name!r}: GPU model or count changed; build a new view")
        self.hosts[state.name] = state

    def release(self, job_id: str, host: str) -> int:
        """Undo `job_id`'s reservation on `host`; returns the GPUs given back (0 if none)."""
        per = self._held.get(job_id)
        if not per or host not in per:
            return 0
        gpus = per.pop(host)
        if not per:
            del self._held[job_id]
        free = self._free[host]
        self._free[host] = free + gpus
        self._shift(host, free, free + gpus)
        return gpus

    # ---------------------------------------------------------------------------- capacity

    def capacity_by_group(self, gpu_model: str | None, gpus: int) -> list[int]:
        """Per leaf group: hosts of `gpu_model` (None = any) with at least `gpus` free GPUs now.
        An upper bound of the hosts that can take one member: Filter plugins may drop more."""
        cols = self._cap.get(gpu_model)
        if cols is None or gpus > self._max_gpus or gpus < 1:
            return [0] * len(self.group_hosts)
        return list(cols[gpus])


_Answer = tuple["HostState", int, str | None, list[float], float]
assert PlacementAsk.__struct_fields__[0] == "job_id"  # an ask's shape is every field after it (`_Search`)
# Ask shapes remembered per view before the answers are dropped (a bound on the memory, not a tuning).
_MAX_ASK_SHAPES = 64


class WaitingGang(msgspec.Struct, frozen=True, kw_only=True):
    """A gang whose members are all reserved and whose Permit said wait, until `deadline`."""

    ask: PlacementAsk
    result: PlacementResult
    deadline: dt.datetime


# ----------------------------------------------------------------------------------- outputs


class PlacementResult(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of one placement.

    status        admitted (reserved and permitted), waiting (reserved, Permit waits until
                  `deadline`), unschedulable (nothing fits now, a PreFilter refused or a Reserve
                  failed: `reason` says what is missing; nothing is held) or rejected (a Permit
                  refused, the wait timed out, or the job already holds a reservation in the view)
    hosts         the gang in RANK ORDER (`rank_order.rank_order`), with `gpus_per_host` alongside
    covering_level, covering_index   the smallest subtree holding every host
    leaf_groups   how many leaf groups the gang spans (1 = all under one leaf group)
    sharp, sharp_reason, nccl_env    see `sharp.decide_sharp`
    scores        plugin name -> its 0..100 score of the chosen placement (host scores averaged)
    total_score   the weighted mean of `scores` by the profile's weights
    """

    job_id: str
    status: Literal["admitted", "waiting", "unschedulable", "rejected"]
    hosts: tuple[str, ...] = ()
    gpus_per_host: tuple[int, ...] = ()
    covering_level: int | None = None
    covering_index: int | None = None
    leaf_groups: int = 0
    sharp: bool = False
    sharp_reason: str = ""
    nccl_env: dict[str, str] = {}
    scores: dict[str, float] = {}
    total_score: float = 0.0
    reason: str = ""
    deadline: dt.datetime | None = None


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """A complete host set for a gang, as the GangScore plugins see it: hosts in the order they were
    chosen (not yet rank order), their covering subtree, how many leaf groups they span; and, for
    comparison, the lowest level at which any subtree of the fabric could hold a gang of this size
    and the fewest leaf groups of the fabric's largest size that could (free or not)."""

    hosts: tuple[str, ...]
    covering: Subtree | None
    leaf_groups: int
    min_level: int
    min_leaf_groups: int


# ----------------------------------------------------------------------------- plugin points


class PreFilterResult(msgspec.Struct, frozen=True, kw_only=True):
    """hosts: only these hosts may be considered (None = no narrowing); reject: refuse the ask."""

    hosts: frozenset[str] | None = None
    reject: str | None = None


@runtime_checkable
class PreFilter(Protocol):
    def pre_filter(self, ask: PlacementAsk, view: ClusterView) -> PreFilterResult:
        """Narrow the candidate hosts of `ask` before any host is filtered, or reject the ask.

        May assume: `ask` is valid; `view` is consistent. Runs once per placement.
        Must not: change `view`; return hosts that are not in `view.hosts`. Several PreFilters'
        host sets are intersected; any reject ends the placement (nothing is reserved).
        """
        ...


@runtime_checkable
class Filter(Protocol):
    def filter(self, ask: PlacementAsk, view: ClusterView, host: HostState) -> str | None:
        """None when `host` may run one member of `ask`; otherwise a short reason ("not ready").

        May assume: `host` is in `view`, is cabled to the fabric and has at least
        `ask.gpus_per_host` free GPUs of some model in the view's capacity index (the framework
        checks free GPUs before calling, so a cheap filter stays cheap).
        Must not: change `view`; depend on the other hosts chosen (that is a GangScore's job); be
        slow: it runs on every host of every leaf group the search looks at.
        Reasons are counted across hosts to explain an unschedulable ask, so keep them stable.
        May declare `host_local = True` (see `Profile.host_local`).
        """
        ...


@runtime_checkable
class HostScore(Protocol):
    def score_host(self, ask: PlacementAsk, view: ClusterView, host: HostState) -> float:
        """How good `host` is for one member of `ask`, normalised to 0..100 (100 best).

        May assume: `host` passed every Filter. Must not: change `view`; return a value outside
        0..100 (the framework clamps it). The score picks hosts inside a leaf group and, averaged
        over the members, competes with the other plugins by the profile's weights.
        May declare `host_local = True` (see `Profile.host_local`).
        """
        ...


@runtime_checkable
class GangScore(Protocol):
    def score_gang(self, ask: PlacementAsk, view: ClusterView, candidate: Candidate) -> float:
        """How good the whole host set `candidate` is for `ask`, normalised to 0..100 (100 best).

        May assume: every host of `candidate` passed every Filter; `candidate.covering` is their
        covering subtree. Must not: change `view`; return a value outside 0..100 (clamped).
        Called once per complete candidate (a handful per placement), so it may look at every host.
        """
        ...


@runtime_checkable
class Reserve(Protocol):
    def reserve(self, ask: PlacementAsk, view: ClusterView, host: str, gpus: int) -> str | None:
        """Hold what one member needs on `host` in `view`; None on success, else the reason.

        May assume: `host` was chosen for `ask` and `unreserve` will be called for it if any later
        step fails. Must: change nothing when it fails; be undone exactly by `unreserve`.
        """
        ...

    def unreserve(self, ask: PlacementAsk, view: ClusterView, host: str) -> None:
        """Undo `reserve` for `ask` on `host`. Must be safe to call when nothing is held there."""
        ...


class PermitVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """allow, wait (hold the reservations at most `timeout_s`, None = the profile's timeout) or reject."""

    kind: Literal["allow", "wait", "reject"]
    reason: str = ""
    timeout_s: float | None = None


@runtime_checkable
class Permit(Protocol):
    def permit(self, ask: PlacementAsk, view: ClusterView, hosts: Sequence[str]) -> PermitVerdict:
        """The last gate before a placement is handed out, after every chosen member is reserved.

        May assume: `hosts` is the gang in rank order and `view.held(ask.job_id)` holds them.
        Must not: change `view` (the framework unreserves on reject or timeout). Runs again from
        `Framework.resolve_waiting` while the gang waits, so a wait must be able to turn into allow.
        """
        ...


# ------------------------------------------------------------------------- registry, profile


PluginFactory = Callable[[Mapping[str, Any]], object]

_KIND_METHOD: dict[str, tuple[str, ...]] = {
    "pre_filter": ("pre_filter",),
    "filter": ("filter",),
    "score": ("score_host", "score_gang"),
    "reserve": ("reserve",),
    "permit": ("permit",),
}


class Registry:
    """Plugin name -> factory(args) -> plugin object. A plugin may serve several points (the data
    locality plugin is a PreFilter, a Filter and a HostScore); a profile says which it is used for."""

    def __init__(self) -> None:
        self._factories: dict[str, PluginFactory] = {}

    def register(self, name: str, factory: PluginFactory) -> None:
        if name in self._factories:
            raise ValueError(f"plugin {name!r} is already registered")
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str, args: Mapping[str, Any], where: str, kind: str) -> object:
        factory = self._factories.get(name)
        if factory is None:
            raise ValueError(f"{where}: unknown plugin {name!r}; known: {', '.join(self.names())}")
        try:
            plugin = factory(args)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: plugin {name!r}: {e}") from None
        methods = _KIND_METHOD[kind]
        if not any(callable(getattr(plugin, m, None)) for m in methods):
            raise ValueError(f"{where}: plugin {name!r} is not a {kind} plugin (it has no {' or '.join(methods)})")
        return plugin


class PluginRef(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One plugin of a profile: its registered name, its weight (scores only, 1..100) and its args."""

    name: str
    weight: int = 1
    args: dict[str, Any] = {}


class ProfileConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which plugins run at each point, with weights for the scores; decoded from the scheduler's
    config (TOML/JSON) by `build_profile`."""

    name: str = "default"
    pre_filter: tuple[PluginRef, ...] = (PluginRef(name="data-locality"),)
    filter: tuple[PluginRef, ...] = (
        PluginRef(name="fits"),
        PluginRef(name="health"),
        PluginRef(name="gpu-model"),
        PluginRef(name="data-locality"),
    )
    score: tuple[PluginRef, ...] = (
        PluginRef(name="topology", weight=10),
        PluginRef(name="load", weight=2),
        PluginRef(name="data-locality", weight=3),
        PluginRef(name="link-health", weight=3),
    )
    reserve: tuple[PluginRef, ...] = (PluginRef(name="gpus"),)
    permit: tuple[PluginRef, ...] = (PluginRef(name="gang-barrier"),)
    permit_timeout_s: float = 30.0
    max_candidates: int = 2


class Profile:
    """A built profile: plugin objects per point (see `build_profile`).

    `host_local`: every Filter and HostScore plugin of the profile declares `host_local = True`, a
    promise that its answer for a host depends on nothing but the ask less its job id, the host's
    `HostState` (the same object), its free GPUs (`ClusterView.free`) and what the view holds for its
    whole life (`dataset_hosts`, `host_link`, the fabric); and that it has no side effects. The
    framework then keeps each answer in the view and asks again only when the host's state object or
    free count changed (a cycle places many jobs of one shape: without this, each of them re-runs
    every plugin on every candidate host). Any plugin without the declaration turns this off (a
    subclass of a built-in plugin that reads more must set `host_local = False`).
    """

    def __init__(
        self,
        *,
        name: str,
        pre_filters: list[tuple[str, PreFilter]],
        filters: list[tuple[str, Filter]],
        host_scores: list[tuple[str, HostScore, int]],
        gang_scores: list[tuple[str, GangScore, int]],
        reserves: list[tuple[str, Reserve]],
        permits: list[tuple[str, Permit]],
        permit_timeout_s: float,
        max_candidates: int,
    ) -> None:
        self.name = name
        self.pre_filters = pre_filters
        self.filters = filters
        self.host_scores = host_scores
        self.gang_scores = gang_scores
        self.reserves = reserves
        self.permits = permits
        self.permit_timeout_s = permit_timeout_s
        self.max_candidates = max_candidates
        plugins = [p for _, p in filters] + [p for _, p, _ in host_scores]
        self.host_local = all(getattr(p, "host_local", False) is True for p in plugins)


def build_profile(config: ProfileConfig | Mapping[str, Any] | None = None, registry: Registry | None = None) -> Profile:
    """A `Profile` from config (a `ProfileConfig` or a plain mapping, e.g. a TOML table).

    ValueError, naming the profile and the place (`profile 'batch': score[1]: ...`), for an unknown
    field, an unknown plugin name, a plugin that does not serve that point, a weight outside
    1..100, a plugin listed twice at one point, a non-positive timeout or max_candidates < 1.
    `registry` None = the built-in plugins (`ibpool_core.sched.plugins.default_registry()`).
    """
    if config is None:
        config = ProfileConfig()
    elif not isinstance(config, ProfileConfig):
        try:
            config = msgspec.convert(config, ProfileConfig)
        except msgspec.ValidationError as e:
            name = config.get("name", "?") if isinstance(config, Mapping) else "?"
            raise ValueError(f"profile {name!r}: {e}") from None
    if registry is None:
        from .plugins import default_registry

        registry = default_registry()
    where = f"profile {config.name!r}"
    if not config.permit_timeout_s > 0:
        raise ValueError(f"{where}: permit_timeout_s must be > 0, not {config.permit_timeout_s}")
    if config.max_candidates < 1:
        raise ValueError(f"{where}: max_candidates must be >= 1, not {config.max_candidates}")
    built: dict[str, list[tuple[str, object, int]]] = {}
    for kind in _KIND_METHOD:
        refs: tuple[PluginRef, ...] = getattr(config, kind)
        seen: set[str] = set()
        out: list[tuple[str, object, int]] = []
        for i, ref in enumerate(refs):
            at = f"{where}: {kind}[{i}]"
            if ref.name in seen:
                raise ValueError(f"{at}: plugin {ref.name!r} is listed twice")
            seen.add(ref.name)
            if kind == "score":
                if not 1 <= ref.weight <= 100:
                    raise ValueError(f"{at}: plugin {ref.name!r}: weight must be 1..100, not {ref.weight}")
            elif ref.weight != 1:
                raise ValueError(f"{at}: plugin {ref.name!r}: only score plugins take a weight")
            out.append((ref.name, registry.create(ref.name, ref.args, at, kind), ref.weight))
        built[kind] = out
    host_scores: list[tuple[str, HostScore, int]] = []
    gang_scores: list[tuple[str, GangScore, int]] = []
    for name, plugin, weight in built["score"]:
        if isinstance(plugin, GangScore):
            gang_scores.append((name, plugin, weight))
        else:
            assert isinstance(plugin, HostScore)
            host_scores.append((name, plugin, weight))
    return Profile(
        name=config.name,
        pre_filters=[(n, p) for n, p, _ in built["pre_filter"] if isinstance(p, PreFilter)],
        filters=[(n, p) for n, p, _ in built["filter"] if isinstance(p, Filter)],
        host_scores=host_scores,
        gang_scores=gang_scores,
        reserves=[(n, p) for n, p, _ in built["reserve"] if isinstance(p, Reserve)],
        permits=[(n, p) for n, p, _ in built["permit"] if isinstance(p, Permit)],
        permit_timeout_s=config.permit_timeout_s,
        max_candidates=config.max_candidates,
    )


# ---------------------------------------------------------------------------------- framework


def member_needs(gpus: int, gpu_model: str | None) -> str:
    """What one member needs of a host, as the reasons say it: "4 free GPUs of H100"."""
    return f"{gpus} free GPU{'s' if gpus != 1 else ''}" + (f" of {gpu_model}" if gpu_model else "")


def too_few_hosts(n: int, what: str, total: int) -> str:
    """The reason for an ask that fewer hosts than its members could take at all."""
    return f"needs {n} host{'s' if n != 1 else ''} with {what}; {total} in the whole fabric"


def tier_name(level: int) -> str:
    """A fabric tier's switch group as the reasons name it: "leaf group (tier 1)", "spine group
    (tier 2)", "core group (tier 3)", "tier-k group" above."""
    named = {1: "leaf group", 2: "spine group", 3: "core group"}
    return f"{named[level]} (tier {level})" if level in named else f"tier-{level} group"


def too_few_under_one(n: int, what: str, level: int, best: int) -> str:
    """The reason for a gang capped at `level` that no group of that tier has room for: the tier
    and the most hosts with room that one group of it has."""
    unit = tier_name(level)
    return f"needs {n} hosts with {what} under one {unit}; the best {unit.split(' (')[0]} has {best}"


def _clamp(x: float) -> float:
    return 0.0 if x < 0 or x != x else 100.0 if x > 100 else float(x)


class _Search:
    """The state of one placement's search (see the module docstring, steps 3-4)."""

    def __init__(self, profile: Profile, ask: PlacementAsk, view: ClusterView, allowed: frozenset[str] | None) -> None:
        self.profile, self.ask, self.view, self.allowed = profile, ask, view, allowed
        self.evaluated: dict[int, list[tuple[float, str]]] = {}
        self.host_scores: dict[str, list[float]] = {}
        self.rejections: dict[str, int] = {}
        # the view's answers for this ask's shape (`Profile.host_local`), None: ask every plugin
        self.memo: dict[str, _Answer] | None = None
        if profile.host_local:
            shape = msgspec.structs.astuple(ask)[1:]  # every field but job_id
            memo = view.answers.get(shape)
            if memo is None:
                if len(view.answers) >= _MAX_ASK_SHAPES:
                    view.answers.clear()
                memo = view.answers[shape] = {}
            self.memo = memo

    def evaluate(self, group: int) -> list[tuple[float, str]]:
        """The hosts of `group` that pass every Filter, best host score first (ties: name)."""
        hit = self.evaluated.get(group)
        if hit is not None:
            return hit
        ask, view, g, allowed = self.ask, self.view, self.ask.gpus_per_host, self.allowed
        filters = [f for _, f in self.profile.filters]
        scorers = [s for _, s, _ in self.profile.host_scores]
        weights = [w for _, _, w in self.profile.host_scores]
        wsum = sum(weights) or 1
        free, hosts = view._free, view.hosts  # the framework's own view: no accessor call per host
        out: list[tuple[float, str]] = []
        rejections = self.rejections
        host_scores = self.host_scores
        names: Iterable[str] = view.group_hosts[group]
        if allowed is not None and len(allowed) < len(view.group_hosts[group]):
            # a small allowed set (a PreFilter's, or the caller's `candidates`): walk it, not the group
            group_of = view.group_of
            names = [n for n in allowed if group_of.get(n) == group]
        memo = self.memo
        for name in names:
            n_free = free[name]
            if n_free < g or (allowed is not None and name not in allowed):
                continue
            host = hosts[name]
            if memo is not None:
                kept = memo.get(name)
                if kept is not None and kept[0] is host and kept[1] == n_free:
                    why = kept[2]
                    if why is not None:
                        rejections[why] = rejections.get(why, 0) + 1
                    else:
                        host_scores[name] = kept[3]
                        out.append((kept[4], name))
                    continue
            why = None
            for f in filters:
                why = f.filter(ask, view, host)
                if why is not None:
                    rejections[why] = rejections.get(why, 0) + 1
                    break
            if why is not None:
                if memo is not None:
                    memo[name] = (host, n_free, why, [], 0.0)
                continue
            per = [s.score_host(ask, view, host) for s in scorers]
            total = 0.0
            for i, p in enumerate(per):
                if not 0.0 <= p <= 100.0:  # also catches NaN
                    per[i] = p = _clamp(p)
                total += p * weights[i]
            host_scores[name] = per
            out.append((total / wsum, name))
            if memo is not None:
                memo[name] = (host, n_free, None, per, total / wsum)
        out.sort(key=lambda x: (-x[0], x[1]))
        self.evaluated[group] = out
        return out

    def fill(self, groups: list[int], bound: list[int], need: int) -> list[str] | None:
        """Fill `need` members from `groups` with the fewest groups (step 4), or None."""
        known = self.evaluated
        # a group's capacity: its real count once evaluated, its bound until then
        caps = {gr: (len(known[gr]) if gr in known else bound[gr]) for gr in groups if bound[gr] > 0}
        chosen: list[str] = []
        left = need
        while left > 0 and caps:
            best_fit, fit_cap = -1, 1 << 30
            largest, large_cap = -1, -1
            for gr, c in caps.items():
                if left <= c < fit_cap:
                    best_fit, fit_cap = gr, c
                if c > large_cap:
                    largest, large_cap = gr, c
            gr = best_fit if best_fit >= 0 else largest
            if gr not in known:
                caps[gr] = len(self.evaluate(gr))  # the real count may be below the bound: decide again
                continue
            del caps[gr]
            take = known[gr][:left]
            chosen.extend(name for _, name in take)
            left -= len(take)
        return chosen if left == 0 else None


class Framework:
    """Runs a `Profile`'s plugins to place asks on a `ClusterView` (see the module docstring).

    Pure: no I/O, no clock of its own (`now` is passed in); all state lives in the view.
    """

    def __init__(self, profile: Profile) -> None:
        self.profile = profile

    # ------------------------------------------------------------------------------ choosing

    def _choose(
        self, ask: PlacementAsk, view: ClusterView, allowed: frozenset[str] | None
    ) -> tuple[Candidate, dict[str, float], float] | str:
        """The best candidate with its per-plugin scores and total, or why nothing fits."""
        n, g = ask.hosts, ask.gpus_per_host
        if allowed is None:
            bound = view.capacity_by_group(ask.gpu_model, g)
        else:
            bound = [0] * len(view.group_hosts)
            for name in allowed:
                gi = view.group_of.get(name)
                if gi is not None and view._free[name] >= g:
                    if ask.gpu_model is None or view.hosts[name].gpu_model == ask.gpu_model:
                        bound[gi] += 1
        what = member_needs(g, ask.gpu_model)
        total = sum(bound)
        if total < n:
            return too_few_hosts(n, what, total)
        cap_level = view.levels
        if ask.topology_level is not None and ask.topology_mode == "required":
            cap_level = min(cap_level, ask.topology_level)
        # lowest level at which any subtree of the fabric (free or not) holds n hosts: for scoring
        min_level = next(
            (k for k in range(1, view.levels + 1) if view.largest_subtree[k] >= n),
            view.levels,
        )
        search = _Search(self.profile, ask, view, allowed)
        want_sharp = sharp_wanted(n, ask.wants_sharp)
        holders: frozenset[str] = frozenset()
        if ask.dataset is not None and ask.data_locality == "preferred":
            holders = view.dataset_hosts.get(ask.dataset, frozenset())
        best_seen = (0, 0)  # (level, most hosts bound in one subtree) for the reason
        for k in range(1, cap_level + 1):
            parent, members = view.group_parent[k], view.subtree_groups[k]
            sub_bound = [0] * len(members)
            for gi, b in enumerate(bound):
                if b:
                    sub_bound[parent[gi]] += b
            passing = [t for t, b in enumerate(sub_bound) if b >= n]
            if not passing:
                best_seen = (k, max(sub_bound, default=0))
                continue
            subtrees = view.subtrees[k]
            sub_holders: dict[int, int] = {}
            for name in holders:
                gi = view.group_of.get(name)
                if gi is not None:
                    t = parent[gi]
                    sub_holders[t] = sub_holders.get(t, 0) + 1
            bad: dict[int, int] = {}
            for gi in view.bad_groups:
                bad[parent[gi]] = bad.get(parent[gi], 0) + 1

            def order(t: int) -> tuple[int, int, int, int, int]:
                sharp_miss = 1 if want_sharp and not subtrees[t].sharp else 0  # noqa: B023
                return (sharp_miss, -sub_holders.get(t, 0), bad.get(t, 0), sub_bound[t], t)  # noqa: B023

            passing.sort(key=order)
            complete: list[tuple[Candidate, dict[str, float], float]] = []
            for t in passing:
                chosen = search.fill(members[t], bound, n)
                if chosen is None:
                    continue
                span = len({view.group_of[h] for h in chosen})
                cand = Candidate(
                    hosts=tuple(chosen),
                    covering=view.covering(chosen),
                    leaf_groups=span,
                    min_level=min_level,
                    min_leaf_groups=math.ceil(n / (view.largest_subtree[1] or 1)),
                )
                complete.append((cand, *self._score(ask, view, cand, search)))
                if len(complete) >= self.profile.max_candidates:
                    break
            if complete:
                # best total; ties keep the search order (the first candidate)
                return max(complete, key=lambda c: c[2])
        if best_seen[0] and best_seen[1] < n and search.rejections == {}:
            return too_few_under_one(n, what, best_seen[0], best_seen[1])
        if search.rejections:
            why = "; ".join(f"{c} host{'s' if c != 1 else ''}: {r}" for r, c in sorted(search.rejections.items()))
            return f"needs {n} hosts with {what}; not enough pass the filters ({why})"
        return f"needs {n} hosts with {what}; no subtree holds enough"

    def _score(
        self, ask: PlacementAsk, view: ClusterView, cand: Candidate, search: _Search
    ) -> tuple[dict[str, float], float]:
        scores: dict[str, float] = {}
        weighted = 0.0
        wsum = 0
        hs = search.host_scores
        for i, (name, _, w) in enumerate(self.profile.host_scores):
            s = sum(hs[h][i] for h in cand.hosts) / len(cand.hosts)
            scores[name] = round(s, 3)
            weighted += s * w
            wsum += w
        for name, plugin, w in self.profile.gang_scores:
            s = _clamp(plugin.score_gang(ask, view, cand))
            scores[name] = round(s, 3)
            weighted += s * w
            wsum += w
        return scores, (weighted / wsum if wsum else 0.0)

    # ------------------------------------------------------------------------------- placing

    def place(
        self, ask: PlacementAsk, view: ClusterView, now: dt.datetime, *, candidates: frozenset[str] | None = None
    ) -> PlacementResult:
        """Place `ask` on `view`: PreFilter, choose (Filter/Score), Reserve, Permit.

        Returns admitted or waiting with every member reserved in `view`, or unschedulable /
        rejected with nothing reserved for the job (whatever was reserved on the way is undone).
        A job that already holds reservations in `view` is rejected (place it once per cycle).
        `candidates`: only these hosts are looked at (as if a PreFilter returned them): a caller's
        bound on the hosts scored per placement on a large cluster (None: every host).
        """
        job = ask.job_id
        if view.held(job) or job in view.waiting:
            return PlacementResult(job_id=job, status="rejected", reason="the job already holds a reservation")
        allowed: frozenset[str] | None = candidates
        for name, pf in self.profile.pre_filters:
            res = pf.pre_filter(ask, view)
            if res.reject is not None:
                return PlacementResult(job_id=job, status="unschedulable", reason=f"{name}: {res.reject}")
            if res.hosts is not None:
                allowed = res.hosts if allowed is None else allowed & res.hosts
        choice = self._choose(ask, view, allowed)
        if isinstance(choice, str):
            return PlacementResult(job_id=job, status="unschedulable", reason=choice)
        cand, scores, total = choice
        ranked = sorted(cand.hosts, key=view.rank_key)  # rank_order.rank_order, with cached keys
        sharp = decide_sharp(view.index, ask.hosts, ask.wants_sharp, cand.covering)
        result = PlacementResult(
            job_id=job,
            status="admitted",
            hosts=tuple(ranked),
            gpus_per_host=tuple(ask.gpus_per_host for _ in ranked),
            covering_level=cand.covering.level if cand.covering else None,
            covering_index=cand.covering.index if cand.covering else None,
            leaf_groups=cand.leaf_groups,
            sharp=sharp.enabled,
            sharp_reason=sharp.reason,
            nccl_env=sharp.env,
            scores=scores,
            total_score=round(total, 3),
        )
        # Reserve every member; on the first failure undo all of it (no partial holds)
        done: list[tuple[str, Reserve]] = []
        for host in ranked:
            for name, rp in self.profile.reserves:
                why = rp.reserve(ask, view, host, ask.gpus_per_host)
                if why is not None:
                    self._undo(ask, view, done)
                    return msgspec.structs.replace(
                        result, status="unschedulable", reason=f"{name} could not reserve {host}: {why}"
                    )
                done.append((host, rp))
        return self._permit(ask, view, result, now, first=True)

    def _undo(self, ask: PlacementAsk, view: ClusterView, done: list[tuple[str, Reserve]]) -> None:
        for host, rp in reversed(done):
            rp.unreserve(ask, view, host)

    def _unreserve_all(self, ask: PlacementAsk, view: ClusterView, hosts: Sequence[str]) -> None:
        self._undo(ask, view, [(h, rp) for h in hosts for _, rp in self.profile.reserves])

    def _permit(
        self, ask: PlacementAsk, view: ClusterView, result: PlacementResult, now: dt.datetime, *, first: bool
    ) -> PlacementResult:
        waits: list[tuple[str, PermitVerdict]] = []
        for name, pp in self.profile.permits:
            verdict = pp.permit(ask, view, result.hosts)
            if verdict.kind == "reject":
                self._unreserve_all(ask, view, result.hosts)
                view.waiting.pop(ask.job_id, None)
                return msgspec.structs.replace(
                    result, status="rejected", reason=f"{name}: {verdict.reason}", deadline=None
                )
            if verdict.kind == "wait":
                waits.append((name, verdict))
        if not waits:
            view.waiting.pop(ask.job_id, None)
            return msgspec.structs.replace(result, status="admitted", reason="", deadline=None)
        if first:
            timeout = min(v.timeout_s or self.profile.permit_timeout_s for _, v in waits)
            deadline = now + dt.timedelta(seconds=timeout)
        else:
            assert result.deadline is not None
            deadline = result.deadline
        reason = "; ".join(f"{name}: {v.reason}" for name, v in waits)
        waiting = msgspec.structs.replace(result, status="waiting", reason=reason, deadline=deadline)
        view.waiting[ask.job_id] = WaitingGang(ask=ask, result=waiting, deadline=deadline)
        return waiting

    def resolve_waiting(self, view: ClusterView, now: dt.datetime) -> list[PlacementResult]:
        """Run Permit again for every waiting gang: admitted when all allow; rejected (and fully
        unreserved) when one rejects or the deadline has passed; otherwise still waiting."""
        out: list[PlacementResult] = []
        for job in list(view.waiting):
            w = view.waiting[job]
            res = self._permit(w.ask, view, w.result, now, first=False)
            if res.status == "waiting" and now >= w.deadline:
                self._unreserve_all(w.ask, view, w.result.hosts)
                del view.waiting[job]
                res = msgspec.structs.replace(
                    res, status="rejected", reason=f"permit timed out at {w.deadline.isoformat()}: {res.reason}"
                )
            out.append(res)
        return out
