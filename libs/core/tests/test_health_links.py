"""Links -> what depends on them (a host's rail, a leaf's hosts) and which problems take them out."""

import pytest

from ibpool_core.fabric.generators import rail_optimised
from ibpool_core.fabric.model import Ca, Host, Link, PortRef, Switch, build_topology
from ibpool_core.health.link_signals import cordoning_problems, link_targets


def two_leaf_tree():
    hosts = [Host(name=f"n{i}") for i in range(4)]
    cas = [Ca(guid=f"0x{0xA0 + i:016x}", host=f"n{i}", name="mlx5_0") for i in range(4)]
    sw = [
        Switch(guid=f"0x{0x10:016x}", name="leaf0", radix=8),
        Switch(guid=f"0x{0x11:016x}", name="leaf1", radix=8),
        Switch(guid=f"0x{0x20:016x}", name="spine", radix=8),
    ]
    links = [Link(a=PortRef(cas[i].guid, 1), b=PortRef(sw[i // 2].guid, 1 + i % 2)) for i in range(4)] + [
        Link(a=PortRef(sw[0].guid, 8), b=PortRef(sw[2].guid, 1)),
        Link(a=PortRef(sw[1].guid, 8), b=PortRef(sw[2].guid, 2)),
    ]
    return build_topology(hosts=hosts, cas=cas, switches=sw, links=links), links


def test_host_cables_are_rails_and_leaf_uplinks_cover_the_leaf_hosts() -> None:
    topo, links = two_leaf_tree()
    t = link_targets(topo)
    host0 = t[links[0].link_id]
    assert (host0.kind, host0.node_ids, host0.rail) == ("host_rail", ["n0"], 0)
    up0 = t[links[4].link_id]
    assert (up0.kind, up0.node_ids, up0.leaf) == ("leaf_uplink", ["n0", "n1"], "leaf0")
    assert t[links[5].link_id].node_ids == ["n2", "n3"]
    assert len(t) == 6


def test_rail_optimised_hosts_have_one_target_per_rail() -> None:
    topo = rail_optimised(hosts=4)
    t = link_targets(topo)
    rails = sorted({x.rail for x in t.values() if x.kind == "host_rail" and x.node_ids == [topo.hosts[0].name]})
    cas_of_host = [c for c in topo.cas if c.host == topo.hosts[0].name]
    assert len(rails) == len(cas_of_host) and rails == sorted(range(len(cas_of_host)))


@pytest.mark.parametrize(
    ("active", "degraded", "want"),
    [
        ([], True, []),
        (["down"], False, ["down"]),
        (["flapping", "errors"], False, ["flapping"]),
        (["errors"], True, ["errors"]),
        (["degraded_width", "congested"], True, ["degraded_width"]),
        (["congested"], True, []),
        (["degraded_speed"], False, []),
    ],
)
def test_which_problems_cordon(active: list[str], degraded: bool, want: list[str]) -> None:
    assert cordoning_problems(active, degraded) == want
