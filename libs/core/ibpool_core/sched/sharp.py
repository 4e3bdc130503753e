"""SHARP (in-network reduction) for a placed gang: whether to turn it on, why not, and how.

SHARP aggregates a reduction in the switches of an aggregation tree instead of sending every
GPU's data through the hosts, which roughly halves the bytes a ring allreduce moves over the
fabric. A job can use it only when every switch between its hosts can aggregate, i.e. when the
gang's covering subtree (`FabricIndex.covering_subtree`) is SHARP-capable (`Subtree.sharp`: every
one of its switches has the SHARP flag). Subtrees are nested, so a gang that fits under a SHARP
subtree at one level fits under one at every lower level that holds it: the placement that keeps
the covering subtree smallest is also the one most likely to get SHARP.

Who gets it: a multi-node job unless it opted out (`wants_sharp=False`). `wants_sharp=None` means
"decide for me", and the scheduler decides yes for every multi-node gang, because in-network
reduction helps every data-parallel collective and costs the job nothing when it is off in NCCL's
tuning. A single-node job reduces over NVLink and never reaches the fabric.

What turns it on: NCCL loads the NCCL-RDMA-SHARP plugin (HPC-X / DOCA-Host) and uses its CollNet
transport when `NCCL_COLLNET_ENABLE=1`; the SHARP collective library's streaming aggregation trees
(SAT, the mode for large GPU reductions on Quantum-2) are turned on by `SHARP_COLL_ENABLE_SAT=1`.
Both names are from NVIDIA's HPC-X "NCCL-RDMA-SHARP Plugins" and SHARP "Collective Library" docs.

SHARP is a bounded resource (`SharpTrees`). NVIDIA's SHARP release notes (Rev 3.13, "Capabilities
and Limitations") give the limits: a Quantum (HDR) switch runs one active streaming-aggregation
tree at a time; a Quantum-2 (NDR) switch runs several in parallel, one active tree per port; a
subnet holds at most 511 SAT trees on Quantum-2 (63 on Quantum). A job whose gang is SHARP-capable
gets its trees only when they have room, one tree per rail its members share (NCCL's CollNet runs
a channel per adapter): on each rail the leaves its members are cabled to, joined by the lowest
SHARP-capable switch above them all, through switches and cables with room. The NCCL settings go
into the grant only when the trees were reserved; the job holds them until it ends (the caller
counts the trees of its live jobs, `SharpTrees(held=...)`), and a placement without them says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

import msgspec

from ..fabric.index import FabricIndex, Subtree

#: The environment a SHARP-enabled grant carries to every member of the gang.
SHARP_NCCL_ENV: dict[str, str] = {"NCCL_COLLNET_ENABLE": "1", "SHARP_COLL_ENABLE_SAT": "1"}


class SharpLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How many SHARP streaming-aggregation trees the fabric runs at once (see the module docstring).

    per               "link": each cable (a port at each end) carries at most `trees_per_link` trees,
                      the Quantum-2 rule (one active tree per port); "switch": each switch runs at
                      most `trees_per_switch` trees, the Quantum (HDR) rule (one per switch)
    max_trees         trees in the whole subnet (Quantum-2: 511; Quantum: 63)
    """

    per: Literal["link", "switch"] = "link"
    trees_per_link: int = 1
    trees_per_switch: int = 1
    max_trees: int = 511

    def __post_init__(self) -> None:
        for name in ("trees_per_link", "trees_per_switch", "max_trees"):
            if getattr(self, name) < 1:
                raise ValueError(f"sharp limits: {name} must be >= 1, not {getattr(self, name)}")


class SharpTree(msgspec.Struct, frozen=True, kw_only=True):
    """The SHARP trees one job holds: `trees` (one per rail its members share), the aggregation
    switches they run on (GUIDs) and the cables they use (`SharpTrees` cable ids)."""

    trees: int
    switches: tuple[str, ...]
    cables: tuple[str, ...]


class SharpDecision(msgspec.Struct, frozen=True, kw_only=True):
    """enabled: SHARP is on for the placement; reason: why (or why not), one sentence for a person;
    env: the NCCL/SHARP settings to hand to the job (empty when disabled); tree: the trees reserved
    for it (`SharpTrees.reserve`; None when none were, or not yet)."""

    enabled: bool
    reason: str
    env: dict[str, str] = {}
    tree: SharpTree | None = None


def sharp_wanted(nodes: int, wants_sharp: bool | None) -> bool:
    """True when the scheduler should try to place the job under a SHARP subtree: a multi-node job
    that did not opt out (None = decide: yes)."""
    return nodes > 1 and wants_sharp is not False


def decide_sharp(index: FabricIndex, nodes: int, wants_sharp: bool | None, covering: Subtree | None) -> SharpDecision:
    """Whether a gang of `nodes` hosts whose covering subtree is `covering` runs with SHARP.

    May assume: `covering` is the covering subtree of the gang's hosts in `index` (None when the
    hosts share no subtree). Pure: reads `index` only.
    """
    if nodes <= 1:
        return SharpDecision(enabled=False, reason="single-node job: its reductions stay on NVLink inside the host")
    if wants_sharp is False:
        return SharpDecision(enabled=False, reason="the job opted out of SHARP (wants_sharp=false)")
    if covering is not None and covering.sharp:
        where = f"level-{covering.level} subtree #{covering.index} ({len(covering.hosts)} hosts)"
        return SharpDecision(
            enabled=True, reason=f"every switch of the covering {where} is SHARP-capable", env=dict(SHARP_NCCL_ENV)
        )
    # the reasons below cost a scan of the switches; only placements without SHARP pay it
    if not any(switch.sharp for switch in index.topology.switches):
        return SharpDecision(enabled=False, reason="the fabric has no SHARP-capable switch")
    if covering is None:
        return SharpDecision(enabled=False, reason="the hosts share no subtree of the fabric")
    where = f"level-{covering.level} subtree #{covering.index} ({len(covering.hosts)} hosts)"
    return SharpDecision(
        enabled=False,
        reason=f"the gang's covering {where} has switches without SHARP; no SHARP subtree had room for it",
    )


class SharpTrees:
    """The SHARP trees in use on one fabric and room for more, for one decision (a cycle).

    `held`: the trees of the jobs that hold them now (their `SharpTree`s; ids the fabric no longer
    has are ignored). `reserve(hosts, decision)` turns a SHARP-capable decision into one with trees
    reserved (taken here, so the next reservation of the same cycle sees them) or into SHARP off
    with the reason; decisions without SHARP pass through. Deterministic: switches are tried in GUID
    order, so the same input reserves the same trees.
    """

    def __init__(self, index: FabricIndex, limits: SharpLimits, held: Iterable[SharpTree] = ()) -> None:
        self.index = index
        self.limits = limits
        self.switch_use: dict[str, int] = {}
        self.cable_use: dict[str, int] = {}
        self.trees = 0
        self._up: dict[str, frozenset[str]] = {}  # switch -> every SHARP switch reachable upward, itself included
        for tree in held:
            self._add(tree)

    def _add(self, tree: SharpTree, step: int = 1) -> None:
        self.trees += step * tree.trees
        for sw in tree.switches:
            self.switch_use[sw] = self.switch_use.get(sw, 0) + step
        for c in tree.cables:
            self.cable_use[c] = self.cable_use.get(c, 0) + step

    def release(self, tree: SharpTree) -> None:
        """Give back the trees of a job that ended (a caller that keeps one `SharpTrees` over time,
        as the simulator does; the service counts the live jobs' trees anew every cycle)."""
        self._add(tree, -1)

    def reserve(self, hosts: Sequence[str], decision: SharpDecision) -> SharpDecision:
        """`decision` with the trees for the gang on `hosts` reserved, or SHARP off saying why."""
        if not decision.enabled:
            return decision
        found = self.plan(hosts)
        if isinstance(found, str):
            return SharpDecision(enabled=False, reason=f"SHARP-capable, but {found}")
        self._add(found)
        return msgspec.structs.replace(
            decision, reason=f"{decision.reason}; {found.trees} SHARP tree(s) reserved", tree=found
        )

    # -- planning ----------------------------------------------------------------------------------

    def _upward(self, switch: str) -> frozenset[str]:
        hit = self._up.get(switch)
        if hit is None:
            out = {switch}
            for above in self.index.uplinks(switch):
                if self.index.switch_sharp(above):
                    out |= self._upward(above)
            hit = self._up[switch] = frozenset(out)
        return hit

    def _switch_room(self, switch: str, pending: dict[str, int]) -> bool:
        if self.limits.per != "switch":
            return True
        return self.switch_use.get(switch, 0) + pending.get(switch, 0) < self.limits.trees_per_switch

    def _cable_room(self, cable: str, count: int, pending: dict[str, int]) -> bool:
        if self.limits.per != "link":
            return True
        return self.cable_use.get(cable, 0) + pending.get(cable, 0) < count * self.limits.trees_per_link

    def plan(self, hosts: Sequence[str]) -> SharpTree | str:
        """The trees a gang on `hosts` would hold (nothing is taken), or why it cannot have them."""
        index, limits = self.index, self.limits
        rails = set(index.rails(hosts[0]))
        for h in hosts[1:]:
            rails &= set(index.rails(h))
        if not rails:
            return "its hosts share no rail"
        if self.trees + len(rails) > limits.max_trees:
            return f"the subnet runs {self.trees} SHARP trees of at most {limits.max_trees}"
        switches: dict[str, int] = {}
        cables: dict[str, int] = {}
        for rail in sorted(rails):
            found = self._rail_tree(hosts, rail, switches, cables)
            if found is not None:
                return found
        return SharpTree(trees=len(rails), switches=tuple(sorted(switches)), cables=tuple(sorted(cables)))

    def _rail_tree(
        self, hosts: Sequence[str], rail: int, switches: dict[str, int], cables: dict[str, int]
    ) -> str | None:
        """Add rail `rail`'s tree to `switches`/`cables` (pending use of this plan); why not, else None."""
        index = self.index
        leaves: list[str] = []
        for h in hosts:
            leaf = index.leaf_of(h, rail)
            assert leaf is not None  # every host has the rail
            if not index.switch_sharp(leaf):
                return f"leaf {self._name(leaf)} (rail {rail}) is not SHARP-capable"
            cable = f"{h}/{rail}~{leaf}"
            if not self._cable_room(cable, 1, cables):
                return f"the cable of {h} on rail {rail} carries a SHARP tree already"
            cables[cable] = cables.get(cable, 0) + 1
            if leaf not in leaves:
                leaves.append(leaf)
        leaves.sort()
        tree: set[str] = set()
        if len(leaves) == 1:
            tree.add(leaves[0])
        else:
            common = frozenset.intersection(*(self._upward(leaf) for leaf in leaves)) - set(leaves)
            roots = sorted(common, key=lambda s: (index.switch_tier(s), s))
            for root in roots:
                built = self._join(leaves, root, switches, cables)
                if built is not None:
                    tree = built
                    break
            else:
                why = (
                    "no SHARP-capable switch joins its leaves" if not roots else "every SHARP path joining them is full"
                )
                return f"on rail {rail} {why} ({self._limit()})"
        for sw in tree:
            if not self._switch_room(sw, switches):
                return f"switch {self._name(sw)} runs its limit of SHARP trees ({self._limit()})"
        for sw in tree:
            switches[sw] = switches.get(sw, 0) + 1
        return None

    def _join(self, leaves: list[str], root: str, switches: dict[str, int], cables: dict[str, int]) -> set[str] | None:
        """The switches of a tree from every leaf up to `root` through switches and cables with room,
        paths merging where they meet; its cables are added to `cables` (kept only on success)."""
        if not self._switch_room(root, switches):
            return None
        tree = {root}
        added: dict[str, int] = {}

        def pending() -> dict[str, int]:
            return {c: cables.get(c, 0) + added.get(c, 0) for c in {*cables, *added}}

        def up(s: str) -> list[str] | None:
            if s in tree:
                return [s]
            for above, count in self.index.uplinks(s).items():
                if root not in self._upward(above) or not self.index.switch_sharp(above):
                    continue
                cable = "~".join(sorted((s, above)))
                if not self._cable_room(cable, count, pending()):
                    continue
                if above not in tree and not self._switch_room(above, switches):
                    continue
                rest = up(above)
                if rest is not None:
                    added[cable] = added.get(cable, 0) + 1
                    return [s, *rest]
            return None

        for leaf in leaves:
            if not self._switch_room(leaf, switches):
                return None
            path = up(leaf)
            if path is None:
                return None
            tree.update(path)
        for cable, n in added.items():
            cables[cable] = cables.get(cable, 0) + n
        return tree

    def _limit(self) -> str:
        lim = self.limits
        if lim.per == "link":
            return f"{lim.trees_per_link} tree per cable"
        return f"{lim.trees_per_switch} tree per switch"

    def _name(self, guid: str) -> str:
        for sw in self.index.topology.switches:
            if sw.guid == guid:
                return sw.name or guid
        return guid
