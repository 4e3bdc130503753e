"""Fabric links -> what depends on them, and which link problems take what out of service.

Pure. `link_targets(topology)` maps each link to the hosts that depend on it: a host's cable to its
leaf is one rail of that host (`host_rail`); a leaf's cable up the tree carries the traffic of every
host under that leaf to the rest of the fabric, which only multi-node work needs (`leaf_uplink`).
Links between higher tiers have redundant paths and cordon nothing. `cordoning_problems` says which
of the fabric monitor's link problems take a link out: down and flapping always, degraded width or
speed and error bursts when `cordon_degraded` is set, congestion never (it is load, not a fault).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec

from ibpool_core.fabric.model import Topology

LinkTargetKind = Literal["host_rail", "leaf_uplink"]

HARD_PROBLEMS = frozenset({"down", "flapping"})
DEGRADED_PROBLEMS = frozenset({"errors", "degraded_width", "degraded_speed"})


class LinkTarget(msgspec.Struct, frozen=True, kw_only=True):
    """What a link failure takes out: one rail of one host, or the multi-node reach of a leaf's hosts."""

    link_id: str
    kind: LinkTargetKind
    node_ids: list[str]
    rail: int | None = None
    leaf: str | None = None
    # The leaf switch's GUID (a leaf uplink); what placement keys a leaf's link health by.
    leaf_guid: str | None = None


def link_targets(topology: Topology) -> dict[str, LinkTarget]:
    """Every host cable and leaf uplink of `topology`, by link id (host name = node id)."""
    ca_rail: dict[str, tuple[str, int]] = {}
    by_host: dict[str, list[tuple[str, str, int | None]]] = {}
    for ca in topology.cas:
        by_host.setdefault(ca.host, []).append((ca.name, ca.guid, ca.rail))
    for host, items in by_host.items():
        # The same rule as FabricIndex: an explicit rail, else the adapter's position by name.
        for pos, (_name, guid, rail) in enumerate(sorted(items)):
            ca_rail[guid] = (host, pos if rail is None else rail)
    switch_names = {s.guid: s.name for s in topology.switches}
    hosts_of_leaf: dict[str, set[str]] = {}
    for link in topology.links:
        a, b = link.a.guid, link.b.guid
        for end, sw in ((a, b), (b, a)):
            if end in ca_rail and sw in switch_names:
                hosts_of_leaf.setdefault(sw, set()).add(ca_rail[end][0])
    targets: dict[str, LinkTarget] = {}
    for link in topology.links:
        a, b = link.a.guid, link.b.guid
        lid = link.link_id
        if a in ca_rail or b in ca_rail:
            host, rail = ca_rail[a] if a in ca_rail else ca_rail[b]
            targets[lid] = LinkTarget(link_id=lid, kind="host_rail", node_ids=[host], rail=rail)
        elif a in switch_names and b in switch_names and ((a in hosts_of_leaf) != (b in hosts_of_leaf)):
            leaf = a if a in hosts_of_leaf else b
            targets[lid] = LinkTarget(
                link_id=lid,
                kind="leaf_uplink",
                node_ids=sorted(hosts_of_leaf[leaf]),
                leaf=switch_names[leaf],
                leaf_guid=leaf,
            )
    return targets


def cordoning_problems(active: Iterable[str], cordon_degraded: bool) -> list[str]:
    """The active problems of a link that take it out of service, sorted; empty: the link is usable."""
    wanted = HARD_PROBLEMS | DEGRADED_PROBLEMS if cordon_degraded else HARD_PROBLEMS
    return sorted(set(active) & wanted)
