"""The fabric every placing service sees: one `FabricIndex` of the published topology, replaced
whole when a new version arrives, and where the health of its links falls.

The pool names nodes by node id and the fabric names hosts; they are taken to be the same names
(node agents register under the host's name; the fabric monitor renames generated hosts to match).
A node the fabric does not have has no distance and no leaf group.

    state = fabric_state(topology, version=3, origin="http://fabric:8080/v1/topology?version=3")  # O(links)
    view.replace(state)        # readers see the old state or the new one, never a mix
    view.hops("node-001", "node-017")      # for remote grants (`allocate.Hops`)
    view.leaf_group("node-001")            # for gangs (`policy_placer`)
    state.link_health({link_id: "degraded"})   # host / leaf GUID -> worst state, for placement

Leaf groups are the fabric's level-1 subtrees (`FabricIndex.leaf_groups`): one leaf switch and its
hosts on a single-rail fat-tree, the rail leaves and hosts of one scalable unit on a rail-optimised
fabric. Hosts of one group are one switch apart on every rail they share.

Pure and synchronous: the runtime's `ibpool_runtime.fabric_feed` fetches topologies, builds the
state (in a worker thread, it is the expensive part) and calls `replace`.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from ..health.link_signals import LinkTarget, link_targets
from .index import FabricIndex
from .link_health import LinkState
from .model import Topology, content_hash

_LINK_RANK: dict[str, int] = {"up": 0, "degraded": 1, "flapping": 2, "down": 3}


class NoFabric(LookupError):
    """A distance was asked before any topology was known."""


class FabricAbout(msgspec.Struct, frozen=True, kw_only=True):
    """What the current fabric is and where it came from.

    version        the fabric monitor's topology version; None for a topology read from a file
    content_hash   `fabric.model.content_hash` of the topology
    origin         the URL or file it was read from
    """

    version: int | None
    content_hash: str
    origin: str
    name: str
    hosts: int
    switches: int
    links: int
    leaf_groups: int
    # The fabric's tiers (1: one leaf tier; 2: leaf/spine; 3: leaf/spine/core) and its SHARP-capable switches.
    levels: int = 0
    sharp_switches: int = 0


class FabricState:
    """One topology with its index, its leaf groups by host and what each link serves
    (`health.link_signals.link_targets`); immutable once built."""

    def __init__(
        self, index: FabricIndex, about: FabricAbout, leaf_of: dict[str, str], targets: dict[str, LinkTarget]
    ) -> None:
        self.index = index
        self.about = about
        self.leaf_of = leaf_of
        self.targets = targets

    def link_health(self, links: Mapping[str, LinkState]) -> dict[str, LinkState]:
        """Where the states of `links` (link id -> state) fall on this fabric, for placement: host
        name -> the worst state of its own adapters' cables, leaf GUID -> the worst state of its
        uplinks. Links above the leaves (redundant paths), links this fabric does not have and "up"
        states are left out."""
        out: dict[str, LinkState] = {}
        for link_id, st in links.items():
            if st == "up" or (target := self.targets.get(link_id)) is None:
                continue
            place = target.node_ids[0] if target.kind == "host_rail" else target.leaf_guid
            if place is not None and _LINK_RANK[st] > _LINK_RANK[out.get(place, "up")]:
                out[place] = st
        return out


def fabric_state(topology: Topology, *, version: int | None, origin: str, digest: str | None = None) -> FabricState:
    """Index `topology` (O(links)); `digest` is its content hash when the caller already has it."""
    index = FabricIndex(topology)
    groups = index.leaf_groups()
    leaf_of = {host: f"leaf-group-{g.index}" for g in groups for host in g.hosts}
    about = FabricAbout(
        levels=index.levels,
        sharp_switches=sum(1 for s in topology.switches if s.sharp),
        version=version,
        content_hash=digest if digest is not None else content_hash(topology),
        origin=origin,
        name=topology.name,
        hosts=len(topology.hosts),
        switches=len(topology.switches),
        links=len(topology.links),
        leaf_groups=len(groups),
    )
    return FabricState(index, about, leaf_of, link_targets(topology))


class FabricView:
    """The current `FabricState`, or none yet. Its methods read one state, so a `replace` between
    two calls is seen by the second one only."""

    def __init__(self, state: FabricState | None = None) -> None:
        self._state = state

    @property
    def state(self) -> FabricState | None:
        return self._state

    @property
    def about(self) -> FabricAbout | None:
        return self._state.about if self._state is not None else None

    def replace(self, state: FabricState) -> None:
        self._state = state

    def wants(self, version: int, digest: str, name: str | None = None) -> bool:
        """Whether a published topology (`version`, `digest`, its fabric's `name`) should replace the
        current one: there is none, or it differs and is not older than the current published
        version. Versions count within one fabric: a fabric of another name replaces it whatever
        its version (a fabric monitor for a renamed or another fabric)."""
        about = self.about
        if about is None:
            return True
        if about.content_hash == digest:
            return False
        if name is not None and name != about.name:
            return True
        return about.version is None or version >= about.version

    def hops(self, a: str, b: str) -> int | None:
        """Links between nodes `a` and `b` (`FabricIndex.hops`, best rail); None when no path joins
        them. NoFabric while no topology is known; KeyError for a node the fabric does not have."""
        state = self._state
        if state is None:
            raise NoFabric("no fabric topology is known yet")
        return state.index.hops(a, b)

    def leaf_group(self, node_id: str) -> str | None:
        """The leaf group holding `node_id`; None while no topology is known or when the fabric
        does not have the node (or it has no cabled adapter)."""
        state = self._state
        return state.leaf_of.get(node_id) if state is not None else None
