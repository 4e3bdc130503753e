"""Score plugins (0..100, 100 best): topology of the whole gang, load and link health per host."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..framework import Candidate, ClusterView, HostState, PlacementAsk
from ..sharp import sharp_wanted
from .args import numeric_args


class Topology:
    """`topology` (GangScore): how close the gang's hosts are on the fabric. The mean of:

    subtree   100 when the covering subtree is at the lowest level that any subtree of the fabric
              could hold a gang of this size at (`Candidate.min_level`), falling linearly to
              100/(levels - min_level + 1) at the top level; 0 when no subtree covers the hosts
    span      100 * fewest possible leaf groups / leaf groups spanned (minimal leaf span)
    rails     100 * rails every member has / rails any member has (all members on one rail
              group: each rail's ring stays in its own rail plane; NCCL's SHARP trees need it)
    sharp     only for a job that wants SHARP (`sharp.sharp_wanted`): 100 under a SHARP-capable
              covering subtree, else 0 (so a multi-node training job lands under one when it can
              without asking)
    level     only for a "preferred" `topology_level`: 100 within it, else 0

    Contract: reads `view.index` and the candidate only; O(members * levels).
    """

    def score_gang(self, ask: PlacementAsk, view: ClusterView, candidate: Candidate) -> float:
        index = view.index
        cov = candidate.covering
        parts: list[float] = []
        if cov is None:
            parts.append(0.0)
        elif cov.level <= candidate.min_level:
            parts.append(100.0)
        else:
            parts.append(100.0 * (index.levels - cov.level + 1) / (index.levels - candidate.min_level + 1))
        parts.append(100.0 * candidate.min_leaf_groups / max(candidate.leaf_groups, 1))
        rail_sets = {view.rails(h) for h in candidate.hosts}  # hosts cabled alike share one set
        common = frozenset.intersection(*rail_sets)
        union = frozenset.union(*rail_sets)
        parts.append(100.0 * len(common) / len(union) if union else 0.0)
        if sharp_wanted(ask.hosts, ask.wants_sharp):
            parts.append(100.0 if cov is not None and cov.sharp else 0.0)
        if ask.topology_level is not None and ask.topology_mode == "preferred":
            parts.append(100.0 if cov is not None and cov.level <= ask.topology_level else 0.0)
        return sum(parts) / len(parts)


class Load:
    """`load` (HostScore): for a compute-heavy job, avoid hot and busy hosts (a host with free GPUs
    may still run other jobs on its other GPUs, which share its power, cooling and PCIe).

        score = 100 * (w_util * (1 - gpu_util) + w_temp * cool + w_mem * (1 - memory_used)) / (sum of w)
        cool  = 1 at or below cool_c, 0 at or above hot_c, linear between

    A job that is not compute-heavy gets 100 everywhere (no preference). Args: w_util (0.5),
    w_temp (0.3), w_mem (0.2), cool_c (45), hot_c (85). Contract: reads `host.telemetry` only.
    """

    host_local = True

    def __init__(self, w_util: float, w_temp: float, w_mem: float, cool_c: float, hot_c: float) -> None:
        if min(w_util, w_temp, w_mem) < 0 or w_util + w_temp + w_mem <= 0:
            raise ValueError("weights must be >= 0 and not all 0")
        if hot_c <= cool_c:
            raise ValueError(f"hot_c ({hot_c}) must be above cool_c ({cool_c})")
        self.w_util, self.w_temp, self.w_mem = w_util, w_temp, w_mem
        self.cool_c, self.hot_c = cool_c, hot_c
        self._wsum = w_util + w_temp + w_mem

    def score_host(self, ask: PlacementAsk, view: ClusterView, host: HostState) -> float:
        if not ask.compute_heavy:
            return 100.0
        t = host.telemetry
        cool = (self.hot_c - t.temperature_c) / (self.hot_c - self.cool_c)
        cool = 0.0 if cool < 0 else 1.0 if cool > 1 else cool
        util = min(max(t.gpu_util, 0.0), 1.0)
        mem = min(max(t.memory_used, 0.0), 1.0)
        return 100.0 * (self.w_util * (1 - util) + self.w_temp * cool + self.w_mem * (1 - mem)) / self._wsum


class LinkHealthScore:
    """`link-health` (HostScore, Filter): avoid hosts behind degraded or flapping links. The host's
    state is the worst of its own links and of the uplinks of every leaf it is cabled to
    (`ClusterView.host_link`, from fabric_monitor's verdicts): up 100, degraded `degraded` (40),
    flapping `flapping` (10), down 0. As a Filter (a hard rule, by config) it refuses a host whose
    state is one of `reject` (a list of "degraded", "flapping", "down"; default ["down"]), for a
    gang's members only unless `single_hosts` is 1: a host's own cable matters to every job, a leaf
    uplink only to multi-node work (the health Filter already keeps out hosts the failover
    controller cordoned). Contract: reads `view.host_link` only."""

    host_local = True

    def __init__(
        self, degraded: float, flapping: float, reject: frozenset[str] = frozenset({"down"}), single_hosts: bool = False
    ) -> None:
        for name, v in (("degraded", degraded), ("flapping", flapping)):
            if not 0 <= v <= 100:
                raise ValueError(f"{name} must be 0..100, not {v}")
        self._by_state = {"up": 100.0, "degraded": degraded, "flapping": flapping, "down": 0.0}
        self.reject = reject
        self.single_hosts = single_hosts

    def score_host(self, ask: PlacementAsk, view: ClusterView, host: HostState) -> float:
        state = view.host_link.get(host.name)
        return 100.0 if state is None else self._by_state[state]

    def filter(self, ask: PlacementAsk, view: ClusterView, host: HostState) -> str | None:
        if ask.hosts <= 1 and not self.single_hosts:
            return None
        state = view.host_link.get(host.name)
        return f"link {state}" if state is not None and state in self.reject else None


class BinPack:
    """`binpack` (HostScore): fill partly used hosts first, so whole hosts stay free for gangs (best
    fit, like the cycle's `LeafPlacer`): 100 when the member takes the host's last free GPUs, 0 when
    the host was wholly free, linear between:

        score = 100 * (1 - left / (total - gpus))   left = free GPUs of the host after the member

    (100 when the member needs the whole host.) Contract: reads `view.free` and `host.total_gpus` only.
    """

    host_local = True

    def score_host(self, ask: PlacementAsk, view: ClusterView, host: HostState) -> float:
        room = host.total_gpus - ask.gpus_per_host
        if room <= 0:
            return 100.0
        left = view.free(host.name) - ask.gpus_per_host
        return 100.0 * (1.0 - left / room)


def make_binpack(args: Mapping[str, Any]) -> BinPack:
    numeric_args(args, {})
    return BinPack()


def make_topology(args: Mapping[str, Any]) -> Topology:
    numeric_args(args, {})
    return Topology()


def make_load(args: Mapping[str, Any]) -> Load:
    a = numeric_args(args, {"w_util": 0.5, "w_temp": 0.3, "w_mem": 0.2, "cool_c": 45.0, "hot_c": 85.0})
    return Load(a["w_util"], a["w_temp"], a["w_mem"], a["cool_c"], a["hot_c"])


_LINK_STATES = ("degraded", "flapping", "down")


def make_link_health(args: Mapping[str, Any]) -> LinkHealthScore:
    rest = {k: v for k, v in args.items() if k != "reject"}
    a = numeric_args(rest, {"degraded": 40.0, "flapping": 10.0, "single_hosts": 0.0})
    reject = args.get("reject", ["down"])
    if not isinstance(reject, list | tuple) or any(s not in _LINK_STATES for s in reject):
        raise ValueError(f"arg 'reject' must be a list of {', '.join(_LINK_STATES)}, not {reject!r}")
    return LinkHealthScore(a["degraded"], a["flapping"], frozenset(reject), bool(a["single_hosts"]))
