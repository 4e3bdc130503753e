"""The fabric as the allocator sees it: one `FabricIndex`, replaced whole when a new topology arrives.

The pool names nodes by node id and the fabric names hosts; they are taken to be the same names
(node agents register under the host's name; the fabric monitor renames generated hosts to match).
A node the fabric does not have has no distance and no leaf group.

    state = fabric_state(topology, version=3, origin="http://fabric:8080/v1/topology?version=3")  # O(links)
    view.replace(state)        # readers see the old state or the new one, never a mix
    view.hops("node-001", "node-017")      # for remote grants (`allocate.Hops`)
    view.leaf_group("node-001")            # for gangs (`policy_placer`)

Leaf groups are the fabric's level-1 subtrees (`FabricIndex.leaf_groups`): one leaf switch and its
hosts on a single-rail fat-tree, the rail leaves and hosts of one scalable unit on a rail-optimised
fabric. Hosts of one group are one switch apart on every rail they share.

Pure and synchronous: the service fetches topologies, builds the state (in a worker thread, it
is the expensive part) and calls `replace`.
"""

from __future__ import annotations

import msgspec

from ..fabric.index import FabricIndex
from ..fabric.model import Topology, content_hash


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


class FabricState:
    """One topology with its index and its leaf groups by host; immutable once built."""

    def __init__(self, index: FabricIndex, about: FabricAbout, leaf_of: dict[str, str]) -> None:
        self.index = index
        self.about = about
        self.leaf_of = leaf_of


def fabric_state(topology: Topology, *, version: int | None, origin: str, digest: str | None = None) -> FabricState:
    """Index `topology` (O(links)); `digest` is its content hash when the caller already has it."""
    index = FabricIndex(topology)
    groups = index.leaf_groups()
    leaf_of = {host: f"leaf-group-{g.index}" for g in groups for host in g.hosts}
    about = FabricAbout(
        version=version,
        content_hash=digest if digest is not None else content_hash(topology),
        origin=origin,
        name=topology.name,
        hosts=len(topology.hosts),
        switches=len(topology.switches),
        links=len(topology.links),
        leaf_groups=len(groups),
    )
    return FabricState(index, about, leaf_of)


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

    def wants(self, version: int, digest: str) -> bool:
        """Whether a published topology (`version`, `digest`) should replace the current one: there
        is none, or it differs and is not older than the current published version."""
        about = self.about
        if about is None:
            return True
        if about.content_hash == digest:
            return False
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
