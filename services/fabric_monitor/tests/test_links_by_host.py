"""`GET /v1/links?host=`'s index (`api.links_by_host`, one walk over the links per topology) against
its definition: each host's cables, walked for that host alone, on generated fabrics."""

from __future__ import annotations

from ibpool_core.fabric.generators import fat_tree_2tier, rail_optimised
from ibpool_core.fabric.model import Topology
from ibpool_fabric_monitor.api import HostLink, links_by_host


def links_of_host(topology: Topology, host: str) -> dict[str, HostLink]:
    """The definition: link id -> the host's end and the other one, for every cable of `host`'s adapters."""
    cas = {ca.guid: ca for ca in topology.cas if ca.host == host}
    names = {sw.guid: sw.name for sw in topology.switches} | {r.guid: r.name for r in topology.routers}
    names |= {ca.guid: f"{ca.host}/{ca.name or ca.guid}" for ca in topology.cas}
    out: dict[str, HostLink] = {}
    for link in topology.links:
        mine, other = (link.a, link.b) if link.a.guid in cas else (link.b, link.a)
        if mine.guid in cas:
            ca = cas[mine.guid]
            out[link.link_id] = HostLink(
                adapter=ca.name or ca.guid, rail=ca.rail, peer=names.get(other.guid, other.guid)
            )
    return out


def test_the_index_gives_every_host_its_cables_as_a_walk_for_that_host_does() -> None:
    for topology in (rail_optimised(40, su_size=4), fat_tree_2tier(hosts=24, radix=8)):
        index = links_by_host(topology)
        hosts = sorted({ca.host for ca in topology.cas if ca.host})
        assert sorted(index) == hosts and hosts
        for host in hosts:
            assert index[host] == links_of_host(topology, host), host
        assert sum(len(v) for v in index.values()) >= len(hosts)
        assert "no-such-host" not in index
