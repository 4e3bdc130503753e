import pytest

from ibpool_core.fabric.graph import Graph
from ibpool_core.fabric.model import (
    Ca,
    FabricError,
    Host,
    Link,
    PortRef,
    Switch,
    build_topology,
    content_hash,
    diff,
    normalize_guid,
)

SPINE, LEAF1, LEAF2 = "0x0000000000000001", "0x0000000000000002", "0x0000000000000003"


def small(extra_links: list[Link] | None = None):  # type: ignore[no-untyped-def]
    switches = [Switch(guid=g, name=n, radix=8) for g, n in ((SPINE, "spine"), (LEAF1, "leaf1"), (LEAF2, "leaf2"))]
    hosts = [Host(name=f"h{i}") for i in range(4)]
    cas = [Ca(guid=f"0x00000000000001{i:02x}", host=f"h{i}", name="mlx5_0") for i in range(4)]
    links = [
        Link(a=PortRef(LEAF1, 1), b=PortRef(SPINE, 1)),
        Link(a=PortRef(LEAF2, 1), b=PortRef(SPINE, 2)),
    ] + [Link(a=PortRef(cas[i].guid, 1), b=PortRef(LEAF1 if i < 2 else LEAF2, 2 + i % 2)) for i in range(4)]
    return build_topology(hosts=hosts, cas=cas, switches=switches, links=links + (extra_links or []))


def test_tiers_come_from_the_graph() -> None:
    g = Graph(small())
    assert g.tiers() == {SPINE: 2, LEAF1: 1, LEAF2: 1}
    assert g.leaf_hosts() == {LEAF1: ["h0", "h1"], LEAF2: ["h2", "h3"]}
    assert g.host_leaves()["h3"] == [LEAF2]


def test_same_fabric_same_hash_and_empty_diff_whatever_the_order() -> None:
    a = small()
    b = build_topology(hosts=list(reversed(a.hosts)), cas=a.cas, switches=list(reversed(a.switches)), links=a.links)
    assert content_hash(a) == content_hash(b)
    assert diff(a, b).empty


def test_diff_names_what_changed() -> None:
    a = small()
    b = build_topology(
        hosts=a.hosts,
        cas=a.cas,
        switches=a.switches,
        links=[ln if ln.b.guid != SPINE or ln.b.port != 2 else Link(a=ln.a, b=ln.b, width=1) for ln in a.links],
    )
    d = diff(a, b)
    assert d.links_changed == [f"{SPINE}:2-{LEAF2}:1"] and not d.links_added and not d.hosts_changed
    assert content_hash(a) != content_hash(b)


@pytest.mark.parametrize(
    ("link", "message"),
    [
        (Link(a=PortRef(SPINE, 9), b=PortRef(LEAF1, 8)), "beyond its 8 ports"),
        (Link(a=PortRef(SPINE, 7), b=PortRef("0x00000000000000ff", 1)), "unknown GUID"),
        (Link(a=PortRef(SPINE, 1), b=PortRef(LEAF1, 8)), "cabled twice"),
        (Link(a=PortRef(SPINE, 7), b=PortRef(LEAF1, 8), speed="WARP"), "unknown speed"),
    ],
)
def test_inconsistent_links_are_refused_with_the_reason(link: Link, message: str) -> None:
    with pytest.raises(FabricError, match=message):
        small([link])


def test_duplicated_guid_is_refused() -> None:
    t = small()
    with pytest.raises(FabricError, match="duplicated GUID"):
        build_topology(hosts=t.hosts, cas=t.cas, switches=[*t.switches, Switch(guid=SPINE, name="x", radix=4)])


def test_guids_are_normalised() -> None:
    assert normalize_guid("0002C903000E0B72") == normalize_guid(0x2C903000E0B72) == "0x0002c903000e0b72"
    with pytest.raises(FabricError):
        normalize_guid("0x1" + "0" * 16)
