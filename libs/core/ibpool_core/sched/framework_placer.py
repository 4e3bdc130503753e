"""The placement framework (framework.py) as the scheduling cycle's `Placer`. Pure.

The cycle (cycle.py) decides on dense host indices and a `placer.FreeView` of free GPUs, and asks a
`Placer` where one job goes, many times per cycle (every job it examines, the head's reservation on
future views, backfill on a restricted view). `FrameworkPlacer` answers with the plugin framework:
PreFilter, Filter and Score plugins of a `Profile` on one `framework.ClusterView` built for the
cycle (telemetry, health, GPU models, datasets, link health, the fabric).

The cycle's `FreeView` stays the one truth of what is free: before each placement the framework's
view is brought to the free counts of the `FreeView` it is asked about (only the hosts that differ
change, O(hosts) compare), and the profile has no Reserve or Permit plugins, so `Framework.place`
holds nothing; the cycle itself applies the placement and keeps gangs whole (a placement is the
whole gang or None). Reserve/Permit plugins in the profile are tolerated: whatever they hold is
released at once.

`leaf_fabric` builds a two-level fabric (one leaf switch per leaf group, one spine above them) for
callers that know only which leaf each host hangs off (a node label), so that the topology score,
the leaf-group search and SHARP work the same as on a discovered fabric.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence

import msgspec

from ..fabric.index import FabricIndex
from ..fabric.model import Ca, Host, Link, PortRef, Switch, build_topology
from .framework import (
    ClusterView,
    Framework,
    Locality,
    PlacementAsk,
    PlacementResult,
    member_needs,
    too_few_hosts,
    too_few_under_one,
)
from .jobs import Job, host_shares
from .placer import FreeView, Placement

_CHUNK = 64


def _guid(kind: int, index: int) -> str:
    return f"0x{(kind << 40) | index:016x}"


def leaf_fabric(leaf_of: Mapping[str, str], sharp_leaves: Collection[str] = ()) -> FabricIndex:
    """A fabric with one leaf switch per distinct leaf name of `leaf_of` (host -> leaf), each host
    cabled to its leaf by one adapter, and one spine joining the leaves (when there are several).

    `sharp_leaves`: leaves whose switch is SHARP-capable; the spine is SHARP-capable when every leaf
    is. Hosts and leaves are taken in name order, so equal inputs build equal fabrics.
    """
    leaves = sorted(set(leaf_of.values()))
    members: dict[str, list[str]] = {leaf: [] for leaf in leaves}
    for host in sorted(leaf_of):
        members[leaf_of[host]].append(host)
    sharp = set(sharp_leaves)
    switches: list[Switch] = []
    cas: list[Ca] = []
    links: list[Link] = []
    spine = _guid(2, 0)
    for li, leaf in enumerate(leaves):
        guid = _guid(1, li)
        hosts = members[leaf]
        switches.append(
            Switch(guid=guid, name=f"leaf {leaf or '(unlabelled)'}", radix=len(hosts) + 1, sharp=leaf in sharp)
        )
        for port, host in enumerate(hosts, start=1):
            ca = _guid(16, len(cas))
            cas.append(Ca(guid=ca, host=host, name="mlx5_0", ports=1))
            links.append(Link(a=PortRef(guid, port), b=PortRef(ca, 1)))
        if len(leaves) > 1:
            links.append(Link(a=PortRef(guid, len(hosts) + 1), b=PortRef(spine, li + 1)))
    if len(leaves) > 1:
        switches.append(Switch(guid=spine, name="spine", radix=len(leaves), sharp=sharp >= set(leaves)))
    topology = build_topology(
        name="leaf groups",
        hosts=[Host(name=h) for h in leaf_of],
        cas=cas,
        switches=switches,
        links=links,
    )
    return FabricIndex(topology)


class AskHints(msgspec.Struct, frozen=True, kw_only=True):
    """What a job asks of placement beyond GPUs (the rest of `framework.PlacementAsk`)."""

    gpu_model: str | None = None
    dataset: str | None = None
    data_locality: Locality = "preferred"
    compute_heavy: bool = True
    wants_sharp: bool | None = None
    # Only these hosts may take the job (the hosts of its site); None: any.
    hosts: frozenset[str] | None = None


NO_HINTS = AskHints()


class FrameworkPlacer:
    """`placer.Placer` by the plugin framework on `view` (see the module docstring).

    `names[h]` is the host name of the cycle's host index h; every name must be a host of `view`.
    `hints`: job id -> `AskHints` (absent: none). `now` is the time Permit plugins see.
    `sample`: a single-host job is scored on at most this many hosts (0: all), taken from the
    fullest hosts that fit (best fit first, as `LeafPlacer`; the lowest host index first among
    hosts with as many free), plus every host with room that holds
    the job's dataset: what bounds a placement's cost on a large cluster (kube-scheduler scores a
    share of the nodes for the same reason). Gangs are always placed on the whole view.
    After a cycle, `results` holds the framework's last admitted result per job id (hosts in rank
    order, scores, SHARP) and `reasons` the last reason a job could not be placed.
    """

    def __init__(
        self,
        framework: Framework,
        view: ClusterView,
        names: Sequence[str],
        hints: Mapping[str, AskHints],
        now: dt.datetime,
        sample: int = 0,
    ) -> None:
        missing = [n for n in names if n not in view.hosts]
        if missing:
            raise ValueError(f"hosts not in the placement view: {', '.join(missing[:5])}")
        self.framework = framework
        self.view = view
        self.names = list(names)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.hints = hints
        self.now = now
        self.sample = sample
        self._synced = [view.free(n) for n in self.names]
        self._last: list[int] = []  # the hosts of the last placement made
        self._leaf_check: tuple[list[int], bool] | None = None  # (a FreeView's leaf_of, `_leaves_are_groups`)
        self.results: dict[str, PlacementResult] = {}
        self.reasons: dict[str, str] = {}

    def start_cycle(self, hints: Mapping[str, AskHints], now: dt.datetime) -> None:
        """Use this placer for another cycle on the same view and hosts (what a new one would cost
        O(hosts) to set up): new hints and time, empty `results` and `reasons`. The view's free GPUs
        must not have changed since this placer last placed, other than through it."""
        self.hints = hints
        self.now = now
        self.results = {}
        self.reasons = {}

    def _sync(self, free: Sequence[int]) -> None:
        synced = self._synced
        if synced == free:
            return
        view, names = self.view, self.names
        # Between two placements on the cycle's view what changed is most often the hosts of the
        # last placement (the cycle applies it): bring those in step first, then compare once more.
        for h in self._last:
            if synced[h] != free[h]:
                view.set_free(names[h], free[h])
                synced[h] = free[h]
        if synced == free:
            return
        # A placement changes a few hosts: compare in chunks (C speed), walk only the chunks that differ.
        for lo in range(0, len(synced), _CHUNK):
            hi = lo + _CHUNK
            if synced[lo:hi] == free[lo:hi]:
                continue
            for h in range(lo, min(hi, len(synced))):
                if synced[h] != free[h]:
                    view.set_free(names[h], free[h])
                    synced[h] = free[h]

    def cap_level(self, job: Job, max_leaves: int | None) -> int | None:
        """The highest fabric tier `job`'s gang may span in this placement (see `jobs.Job`): its
        level when "required"; when "preferred", the tighter of its level and the lowest tier whose
        largest group could hold it, until the cycle relaxes it (`max_leaves` None); None for a
        single host or a relaxed gang."""
        if job.hosts <= 1 or max_leaves is None:
            return None
        if job.topology == "required":
            return job.topology_level
        return max(job.topology_level, self.view.lowest_level_holding(job.hosts))

    def ask_of(self, job: Job, max_leaves: int | None) -> PlacementAsk:
        hints = self.hints.get(job.id, NO_HINTS)
        level = self.cap_level(job, max_leaves)
        return PlacementAsk(
            job_id=job.id,
            gpus_per_host=host_shares(job)[0],
            hosts=job.hosts,
            gpu_model=hints.gpu_model,
            dataset=hints.dataset,
            data_locality=hints.data_locality,
            topology_level=level,
            topology_mode="required" if level is not None else "preferred",
            wants_sharp=hints.wants_sharp,
            compute_heavy=hints.compute_heavy,
        )

    def candidates(self, view: FreeView, job: Job) -> frozenset[str] | None:
        """The hosts a job is scored on: a single-host job's sample (see `sample`) within the hosts
        its hints allow; a gang, or with no sample, the allowed hosts; None for all."""
        hints = self.hints.get(job.id, NO_HINTS)
        allowed = hints.hosts
        if job.hosts > 1 or self.sample <= 0:
            return allowed
        names, want = self.names, self.sample
        out: list[str] = []
        for bucket in itertools.islice(view.by_free, job.gpus, None):
            if allowed is None:
                out.extend(names[h] for h in itertools.islice(bucket, want - len(out)))
            else:
                out.extend(itertools.islice((names[h] for h in bucket if names[h] in allowed), want - len(out)))
            if len(out) >= want:
                break
        if hints.dataset is not None:
            free = self.view.free
            holders = self.view.dataset_hosts.get(hints.dataset, ())
            out.extend(h for h in holders if free(h) >= job.gpus and (allowed is None or h in allowed))
        return frozenset(out)

    # Answer "too few hosts" from the free counts before the framework (`short_of_hosts`); the same
    # answers either way (tests turn it off to compare).
    count_first = True

    def short_of_hosts(self, view: FreeView, job: Job) -> str | None:
        """The framework's own first answer, "needs n hosts with g free GPUs; k in the whole fabric",
        read from the cycle's free counts alone (no sync, no plugins) when it is certain: for an ask
        counted over every host alike (no GPU model, dataset or host restriction), fewer hosts have a
        member's GPUs free than the job has members. Most of a reservation's tries end here."""
        if not self._counted_alike(job):
            return None
        per, n = host_shares(job)[0], job.hosts
        count = view.hosts_with_at_least(per) if per < len(view.by_free) else 0
        if count >= n:
            return None
        return too_few_hosts(n, member_needs(per, None), count)

    def short_of_one_leaf(self, view: FreeView, job: Job, max_leaves: int | None) -> str | None:
        """The framework's answer to a gang that must stay under one leaf group, "needs n hosts with
        g free GPUs under one leaf group (tier 1); the best leaf group has b", read from the free
        counts when certain: an ask counted over every host alike, the cycle's leaves being the
        framework's leaf groups, and no leaf with n hosts that have a member's GPUs free. Most of
        the tries of a reservation for such a gang end here (one per running job released until a
        leaf has room)."""
        if job.hosts <= 1 or self.cap_level(job, max_leaves) != 1 or not self._counted_alike(job):
            return None
        if not self._leaves_are_groups(view):
            return None
        per, n, leaf_of = host_shares(job)[0], job.hosts, view.leaf_of
        by_leaf: dict[int, int] = {}  # leaf -> its hosts with a member's GPUs free (few, when none has room)
        for bucket in itertools.islice(view.by_free, per, None):
            for h in bucket:
                count = by_leaf.get(leaf_of[h], 0) + 1
                if count >= n:
                    return None
                by_leaf[leaf_of[h]] = count
        best = max(by_leaf.values(), default=0)
        return too_few_under_one(n, member_needs(per, None), 1, best)

    def _counted_alike(self, job: Job) -> bool:
        """Whether the framework counts every host alike for `job` (no GPU model, dataset or host
        restriction): only then can its answer be read from the free counts."""
        hints = self.hints.get(job.id, NO_HINTS)
        return hints.gpu_model is None and hints.dataset is None and hints.hosts is None

    def _leaves_are_groups(self, view: FreeView) -> bool:
        """Whether the free view's leaves are the framework view's leaf groups, host for host (as the
        service and the simulator build them); checked once per `leaf_of` list."""
        if self._leaf_check is not None and self._leaf_check[0] is view.leaf_of:
            return self._leaf_check[1]
        group_of, group_hosts = self.view.group_of, self.view.group_hosts
        pairs: dict[int, int | None] = {}
        same = self.view.levels >= 1
        for h, leaf in enumerate(view.leaf_of):
            group = group_of.get(self.names[h])
            if pairs.setdefault(leaf, group) != group or group is None:
                same = False
                break
        groups = list(pairs.values())
        same = same and len(set(groups)) == len(groups)
        same = same and all(len(group_hosts[g]) == len(view.leaves[leaf]) for leaf, g in pairs.items() if g is not None)
        self._leaf_check = (view.leaf_of, same)
        return same

    def place(self, view: FreeView, job: Job, max_leaves: int | None) -> Placement | None:
        if job.gpus > view.total_free:
            return None
        if self.count_first and (
            (short := self.short_of_hosts(view, job)) is not None
            or (short := self.short_of_one_leaf(view, job, max_leaves)) is not None
        ):
            self.reasons[job.id] = short
            return None
        self._sync(view.free)
        ask = self.ask_of(job, max_leaves)
        result = self.framework.place(ask, self.view, self.now, candidates=self.candidates(view, job))
        for host in list(self.view.held(job.id)):
            self.view.release(job.id, host)
        self.view.waiting.pop(job.id, None)
        if result.status != "admitted":
            self.reasons[job.id] = result.reason
            return None
        hosts = [self.index[h] for h in result.hosts]
        self.results[job.id] = result
        self._last = hosts
        return list(zip(hosts, host_shares(job), strict=True))


def dataset_registry(entries: Iterable[tuple[str, Iterable[str]]]) -> dict[str, frozenset[str]]:
    """dataset -> hosts, merging repeated datasets (the config's registry plus the API's)."""
    out: dict[str, set[str]] = {}
    for name, hosts in entries:
        out.setdefault(name, set()).update(hosts)
    return {k: frozenset(v) for k, v in out.items()}
