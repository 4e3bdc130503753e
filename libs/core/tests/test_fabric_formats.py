"""The importers and exporters on the real fabrics in ../shared/data/fabrics, and their features.

Tests that read the shared data skip only when it is absent, and fail instead when
IBPOOL_REQUIRE_SHARED_DATA=1 (as CI sets).
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from ibpool_core.fabric.formats import (
    EXPORT_FORMATS,
    build_hierarchy,
    export_topology,
    import_topology,
    leaf_groups,
)
from ibpool_core.fabric.formats.ibnetdiscover import (
    adapter_rails,
    export_ibnetdiscover,
    import_ibnetdiscover,
    parse_name_map,
    rail_number,
)
from ibpool_core.fabric.formats.k8s import export_k8s_labels, import_k8s_labels, k8s_name
from ibpool_core.fabric.formats.native import export_native, import_native, native_schema, native_schema_text
from ibpool_core.fabric.formats.slurm import (
    export_slurm_block,
    export_slurm_tree,
    export_slurm_yaml,
    import_slurm,
    import_slurm_block,
    import_slurm_tree,
    import_slurm_yaml,
)
from ibpool_core.fabric.formats.volcano import export_volcano, import_volcano
from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.graph import Graph
from ibpool_core.fabric.model import FabricError, Topology, build_topology, unnamed_host
from ibpool_sim.shared_data import need

REPO = Path(__file__).resolve().parents[3]


def read(relative: str) -> tuple[str, str]:
    """(text, file name as it should appear in messages)"""
    return need(relative).read_text(), relative.rsplit("/", 1)[-1]


def x5() -> Topology:
    text, file = read("fabrics/psmn-x5/X5.topofile")
    names = parse_name_map(read("fabrics/psmn-x5/X5.map")[0], file="X5.map")
    return import_ibnetdiscover(text, file=file, names=names, name="x5")


def slurm_leaf_groups(text: str) -> dict[str, frozenset[str]]:
    """Switch name -> node set of every Nodes= line (the site's file is no tree; read leniently)."""
    topology = import_slurm_tree(text, file="topology.conf", strict=False)
    graph = Graph(topology)
    names = {s.guid: s.name for s in topology.switches}
    return {names[g]: frozenset(h) for g, h in graph.leaf_hosts().items()}


# --- real data -----------------------------------------------------------------------------------

IBTOPOTOOL = {  # switches, hosts, links (self-loops and aggregation nodes left out)
    "1.topo": (2, 4, 7),
    "2.topo": (1, 2, 2),
    "3.topo": (2, 5, 7),
    "4.topo": (1, 1, 1),
}


@pytest.mark.parametrize("name", sorted(IBTOPOTOOL))
def test_every_ibtopotool_dump_imports(name: str) -> None:
    text, file = read(f"fabrics/ibtopotool/{name}")
    topology = import_ibnetdiscover(text, file=file)
    assert (len(topology.switches), len(topology.hosts), len(topology.links)) == IBTOPOTOOL[name]
    assert all(w.startswith(f"{file}:") for w in topology.warnings)
    if all(unnamed_host(h.name) for h in topology.hosts):  # 1.topo: every adapter's description is generic
        with pytest.raises(FabricError, match=r"no named host .*4 host\(s\) named only by an adapter's GUID.*--names"):
            export_slurm_tree(topology)
        (warning,) = [w for w in topology.warnings if "name no host" in w]  # one warning for all four
        assert warning.startswith(f"{file}:") and "4 adapter(s) name no host" in warning and "--names" in warning
        return
    assert export_slurm_tree(topology).text.count("SwitchName=") >= 1


def test_dump_with_umad_error_and_self_loops_imports_with_warnings() -> None:
    text, file = read("fabrics/ibtopotool/3.topo")
    topology = import_ibnetdiscover(text, file=file)
    warnings = "\n".join(topology.warnings)
    assert "3.topo:1: the discovery reported an error" in warnings and "timed out" in warnings
    assert "3.topo:11: S-e41d2d030003e470 has self-looped ports (1-2, 19-21, 29-30)" in warnings
    # the managed switch description names the switch; r-ufm101 has two HCAs: two rails
    assert {s.name for s in topology.switches} == {"S-e41d2d030003e470", "switch-de779e"}
    rails = {c.name: c.rail for c in topology.cas if c.host == "r-ufm101"}
    assert rails == {"HCA-1": 0, "HCA-2": 1}
    assert not any(ln.a.guid == ln.b.guid for ln in topology.links)


def test_generic_adapter_names_come_from_the_guid_with_a_warning() -> None:
    text, file = read("fabrics/ibtopotool/1.topo")
    topology = import_ibnetdiscover(text, file=file)
    assert {h.name for h in topology.hosts} == {
        "H-0008f10403960984",
        "H-005442b100004900",
        "H-0008f10403961354",
        "H-0008f10403960558",
    }
    generic = [w for w in topology.warnings if "generic description" in w]  # one warning for the four
    assert len(generic) == 1 and generic[0].startswith("1.topo:32: 4 adapter(s) name no host")
    # the two ends of a cable disagree on the width: warned, the slower one kept
    assert any("is 1xSDR here but 4xSDR at line 15; kept 1xSDR" in w for w in topology.warnings)
    two_port = [c for c in topology.cas if c.host == "H-0008f10403960558"]
    assert len(two_port) == 1 and two_port[0].ports == 2


@pytest.mark.parametrize("name", ["net", "net.1", "net.2sw2path", "net.2sw2path4hca", "net.2sw2path4hca2port"])
def test_every_ibsim_net_imports(name: str) -> None:
    text, file = read(f"fabrics/ibsim/{name}")
    topology = import_ibnetdiscover(text, file=file)
    assert topology.switches and topology.hosts
    assert {s.name for s in topology.switches} <= {"Switch1", "Switch2"}
    assert any("GUIDs derived from the node names" in w for w in topology.warnings)
    assert all(ln.speed == "SDR" and ln.width == 4 for ln in topology.links)
    again = import_ibnetdiscover(text, file=file)
    assert again == topology  # made-up GUIDs are stable


def test_x5_imports_with_its_name_map() -> None:
    topology = x5()
    graph = Graph(topology)
    assert len(topology.switches) == 11 and len(topology.hosts) == 89
    spines = {
        "0x" + line.strip().removeprefix("S-")
        for line in read("fabrics/psmn-x5/X5.spine")[0].splitlines()
        if line.startswith("S-")
    }
    tiers = graph.tiers()
    assert all(tiers[g] >= 2 for g in spines)  # the site's spines are above the leaves
    assert len(graph.leaves()) == 6 and not spines & set(graph.leaves())
    # three adapters are not in X5.map: named from their GUID, as the site's own file names them
    unnamed = sorted(h.name for h in topology.hosts if unnamed_host(h.name))
    assert unnamed == ["H-003048c749450000", "H-003048c74ae20000", "H-78e7d1030024535c"]
    assert [w for w in topology.warnings if "generic" in w] == [
        f"{read('fabrics/psmn-x5/X5.topofile')[1]}:403: 3 adapter(s) name no host (a generic description, first this "
        'one\'s "MT25408 ConnectX Mellanox Technologies"): each is a host H-<guid>; a GUID -> name map '
        "(--names MAPFILE) names them"
    ]


def test_x5_slurm_tree_has_the_sites_leaf_groups_and_is_a_tree() -> None:
    ours = export_slurm_tree(x5())
    assert ours.warnings == [
        "3 host(s) named only by an adapter's GUID (H-003048c749450000...) are left out: no Slurm, Kubernetes or "
        "Volcano node has such a name"
    ]
    site_text, _ = read("fabrics/psmn-x5/X5.topology.conf")
    # the site's file lists the three adapters X5.map does not name as nodes H-<guid>; ours leaves them out
    site = {s: frozenset(h for h in hosts if not unnamed_host(h)) for s, hosts in slurm_leaf_groups(site_text).items()}
    mine = slurm_leaf_groups(ours.text)
    assert set(mine.values()) == set(site.values())  # the same host set per leaf switch...
    assert mine == site  # ...under the same switch names
    # ours is a tree slurmctld accepts; the site's is not (switches list each other)
    strict = import_slurm_tree(ours.text, file="ours.conf")
    assert not [w for w in strict.warnings if "parents" in w or "top-level" in w or "under both" in w]
    with pytest.raises(Exception, match=r"X5\.topology\.conf:11: switches list each other in a cycle"):
        import_slurm_tree(site_text, file="X5.topology.conf")


def test_x5_every_export_keeps_the_leaf_groups() -> None:
    topology = x5()
    expected = leaf_groups(build_hierarchy(topology))
    for kind in ("slurm", "slurm-block", "native", "ibnetdiscover"):
        text = export_topology(kind, topology).text
        back = import_topology(kind, text, file=f"x5.{kind}")
        assert leaf_groups(build_hierarchy(back)) == expected, kind
    lower = {frozenset(h.lower() for h in g) for g in expected}  # Kubernetes names are lower case
    for kind, reader in (("k8s-labels", import_k8s_labels), ("volcano", import_volcano)):
        back = reader(export_topology(kind, topology).text)
        assert leaf_groups(build_hierarchy(back)) == lower, kind


# --- features --------------------------------------------------------------------------------------

QUANTUM = """\
#
# Topology file: a Quantum switch with its SHARP aggregation node (hand-made in the real layout)
#
vendid=0x2c9
devid=0xd2f0
sysimgguid=0xb8cef60300a1b2c0
switchguid=0xb8cef60300a1b2c0(b8cef60300a1b2c0)
Switch\t41 "S-b8cef60300a1b2c0"\t\t# "MF0;qm8700-leaf1:MQM8700/U1" enhanced port 0 lid 1 lmc 0
[1]\t"H-1070fd0300aabb00"[1](1070fd0300aabb00) \t\t# "dgx01 mlx5_0" lid 2 4xHDR
[2]\t"H-1070fd0300aabb10"[1](1070fd0300aabb10) \t\t# "dgx01 mlx5_3" lid 3 4xHDR
[3]\t"H-1070fd0300aabb20"[1](1070fd0300aabb20) \t\t# "dgx02 mlx5_0" lid 5 2xHDR
[41]\t"H-b8cef60300a1b2c8"[1](b8cef60300a1b2c8) \t\t# "Mellanox Technologies Aggregation Node" lid 4 4xHDR

vendid=0x2c9
devid=0xcf09
caguid=0xb8cef60300a1b2c8
Ca\t1 "H-b8cef60300a1b2c8"\t\t# "Mellanox Technologies Aggregation Node"
[1](b8cef60300a1b2c8) \t"S-b8cef60300a1b2c0"[41]\t\t# lid 4 lmc 0 "MF0;qm8700-leaf1:MQM8700/U1" lid 1 4xHDR

caguid=0x1070fd0300aabb00
Ca\t1 "H-1070fd0300aabb00"\t\t# "dgx01 mlx5_0"
[1](1070fd0300aabb00) \t"S-b8cef60300a1b2c0"[1]\t\t# lid 2 lmc 0 "MF0;qm8700-leaf1:MQM8700/U1" lid 1 4xHDR

caguid=0x1070fd0300aabb10
Ca\t1 "H-1070fd0300aabb10"\t\t# "dgx01 mlx5_3"
[1](1070fd0300aabb10) \t"S-b8cef60300a1b2c0"[2]\t\t# lid 3 lmc 0 "MF0;qm8700-leaf1:MQM8700/U1" lid 1 4xHDR

caguid=0x1070fd0300aabb20
Ca\t1 "H-1070fd0300aabb20"\t\t# "dgx02 mlx5_0"
[1](1070fd0300aabb20) \t"S-b8cef60300a1b2c0"[3]\t\t# lid 5 lmc 0 "MF0;qm8700-leaf1:MQM8700/U1" lid 1 2xHDR
"""


def test_aggregation_node_marks_the_switch_sharp_and_is_no_host() -> None:
    topology = import_ibnetdiscover(QUANTUM, file="quantum.topo")
    (switch,) = topology.switches
    assert switch.sharp and switch.radix == 40 and switch.name == "qm8700-leaf1" and switch.model == "MQM8700"
    assert {h.name for h in topology.hosts} == {"dgx01", "dgx02"}
    assert {(c.host, c.name, c.rail) for c in topology.cas} == {
        ("dgx01", "mlx5_0", 0),
        ("dgx01", "mlx5_3", 3),  # its rail is its own number, not its rank among dgx01's adapters
        ("dgx02", "mlx5_0", None),
    }
    assert sorted((ln.width, ln.speed) for ln in topology.links) == [(2, "HDR"), (4, "HDR"), (4, "HDR")]
    assert topology.warnings == []
    # the exporter writes the aggregation node back; the round trip is exact
    again = import_ibnetdiscover(export_ibnetdiscover(topology).text, file="again.topo")
    assert again == topology


SWITCH = (0xB8CEF60300A1B2C0, "MF0;leaf1:MQM8700/U1")
CAS = [  # (lid, port, port GUID, description, switch port)
    (2, 1, 0x1070FD0300AABB00, "dgx01 mlx5_0", 1),
    (3, 1, 0x1070FD0300AABB10, "dgx01 mlx5_1", 2),
    (5, 1, 0x0002C9030004E939, "MT25408 ConnectX Mellanox Technologies", 3),
    (6, 1, 0x1070FD0300AABC00, "dgx02 mlx5_0", 4),
    (7, 2, 0x1070FD0300AABC01, "dgx02 mlx5_0", 5),
]


def ports_line(
    kind: str, lid: int, port: int, guid: int, rate: str, remote: tuple[object, ...] | None, desc: str
) -> str:
    """A line of `ibnetdiscover -p`, formatted as infiniband-diags' printf does."""
    line = f"{kind:>2} {lid:5d} {port:2d} 0x{guid:016x} {rate}"
    if remote is None:
        return line + " " * 36 + f"'{desc}'"
    rkind, rlid, rport, rguid, rdesc = remote
    return line + f" - {rkind:>2} {rlid:5d} {rport:2d} 0x{rguid:016x} ( '{desc}' - '{rdesc}' )"


PORTS_REPORT = (
    "\n".join(
        [ports_line("CA", lid, p, g, "4x HDR", ("SW", 1, sp, SWITCH[0], SWITCH[1]), d) for lid, p, g, d, sp in CAS]
        + [ports_line("SW", 1, sp, SWITCH[0], "4x HDR", ("CA", lid, p, g, d), SWITCH[1]) for lid, p, g, d, sp in CAS]
        + [ports_line("SW", 1, 6, SWITCH[0], "4x SDR", None, SWITCH[1])]
    )
    + "\n"
)


def test_ports_report_form_imports() -> None:
    topology = import_ibnetdiscover(PORTS_REPORT, file="ports.txt")
    (switch,) = topology.switches
    assert switch.name == "leaf1" and switch.radix == 6
    hosts = {c.host: (c.name, c.ports) for c in topology.cas}
    assert hosts["dgx02"] == ("mlx5_0", 2)  # two ports of one CA: one CA with two ports
    assert sorted(c.name for c in topology.cas if c.host == "dgx01") == ["mlx5_0", "mlx5_1"]
    assert "H-0002c9030004e939" in hosts and any("generic description" in w for w in topology.warnings)
    assert len(topology.links) == 5


def test_name_map_forms() -> None:
    names = parse_name_map(
        '# comment\nH-0002c90300080e84 r510gluster1\n0x0002C90300080D58 "node 2"\n0002c90300080d3c n3\n',
        file="x.map",
    )
    assert names == {
        "0x0002c90300080e84": "r510gluster1",
        "0x0002c90300080d58": "node 2",
        "0x0002c90300080d3c": "n3",
    }


def test_slurm_tree_import_reads_hostlists_comments_and_continuations() -> None:
    text = (
        "# tree\nSwitchName=s0 Nodes=gpu[001-003,040]  # four\nswitchname=s1 nodes=cpu[1-2] LinkSpeed=10\n"
        "SwitchName=top \\\n  Switches=s[0-1]\n"
    )
    topology = import_slurm_tree(text, file="t.conf")
    graph = Graph(topology)
    names = {s.guid: s.name for s in topology.switches}
    assert {names[g]: h for g, h in graph.leaf_hosts().items()} == {
        "s0": ["gpu001", "gpu002", "gpu003", "gpu040"],
        "s1": ["cpu1", "cpu2"],
    }
    assert {names[g]: t for g, t in graph.tiers().items()} == {"s0": 1, "s1": 1, "top": 2}
    assert topology.warnings == []
    out = export_slurm_tree(topology).text.splitlines()
    assert out[1:] == [
        "SwitchName=top Switches=s0,s1",
        "SwitchName=s0 Nodes=gpu[001-003,040]",
        "SwitchName=s1 Nodes=cpu[1-2]",
    ]


def test_slurm_block_and_yaml_round_trip() -> None:
    topology = x5()
    block = export_slurm_block(topology)
    assert block.text.splitlines()[-1] == "BlockSizes=4,8,16"  # the smallest leaf: 5 hosts, one of them unnamed
    back = import_slurm_block(block.text, file="block.conf")
    assert leaf_groups(build_hierarchy(back)) == leaf_groups(build_hierarchy(topology))
    assert import_slurm(block.text, file="block.conf") == back
    text = export_slurm_yaml(topology).text
    data = yaml.safe_load(text)
    assert [t["topology"] for t in data] == ["x5-tree", "x5-block"] and data[0]["cluster_default"] is True
    tree = import_slurm_yaml(text, file="topology.yaml")
    assert import_slurm(text, file="topology.yaml") == tree
    blocks = import_slurm_yaml(text, file="topology.yaml", topology="x5-block")
    expected = leaf_groups(build_hierarchy(topology))
    assert leaf_groups(build_hierarchy(tree)) == leaf_groups(build_hierarchy(blocks)) == expected


def test_slurm_yaml_example_from_the_man_page() -> None:
    text = """\
- topology: topo1
  cluster_default: True
  tree:
    switches:
    - switch: sw_root
      nodes: node[01-04]
- topology: topo2
  cluster_default: False
  block:
    block_sizes:
      - 4
      - 16
    blocks:
    - block: b1
      nodes: node[01-04]
    - block: b2
      nodes: node[05-08]
    - block: b3
      nodes: node[09-12]
    - block: b4
      nodes: node[13-16]
- topology: topo3
  cluster_default: False
  flat: True
"""
    tree = import_slurm_yaml(text, file="topology.yaml")
    assert [s.name for s in tree.switches] == ["sw_root"] and len(tree.hosts) == 4
    block = import_slurm_yaml(text, file="topology.yaml", topology="topo2")
    assert len(block.switches) == 4 and len(block.hosts) == 16 and block.warnings == []


def test_k8s_labels_have_one_label_per_level() -> None:
    topology = import_slurm_tree(
        "SwitchName=l1 Nodes=gpu[1-2]\nSwitchName=l2 Nodes=gpu[3-4]\nSwitchName=l3 Nodes=gpu5\n"
        "SwitchName=s1 Switches=l[1-2]\nSwitchName=core Switches=s1,l3\n",
        file="t.conf",
    )
    exported = export_k8s_labels(topology)
    nodes = {d["metadata"]["name"]: d["metadata"]["labels"] for d in yaml.safe_load_all(exported.text)}
    assert nodes["gpu1"] == {
        "ibpool.io/core": "core",
        "ibpool.io/spine": "s1",
        "ibpool.io/leaf": "l1",
        "kubernetes.io/hostname": "gpu1",
    }
    # gpu5's leaf hangs right under the root: its leaf value repeats one level down
    assert nodes["gpu5"]["ibpool.io/spine"] == nodes["gpu5"]["ibpool.io/leaf"] == "l3"
    assert "ibpool.io/core, ibpool.io/spine, ibpool.io/leaf, kubernetes.io/hostname" in exported.text
    as_json = json.loads(export_k8s_labels(topology, fmt="json").text)
    assert as_json["kind"] == "List" and len(as_json["items"]) == 5
    back = import_k8s_labels(exported.text)
    assert export_slurm_tree(back).text.splitlines()[1:] == export_slurm_tree(topology).text.splitlines()[1:]
    assert k8s_name("S-0008F105_00108c5c") == "s-0008f105-00108c5c" and len(k8s_name("x" * 99)) == 63


def test_volcano_hypernodes_tiers_and_members() -> None:
    topology = import_slurm_tree(
        "SwitchName=L1 Nodes=gpu[001-032]\nSwitchName=L2 Nodes=gpu[033-040]\nSwitchName=S Switches=L[1-2]\n",
        file="t.conf",
    )
    docs = list(yaml.safe_load_all(export_volcano(topology).text))
    assert {d["metadata"]["name"]: d["spec"]["tier"] for d in docs} == {"s": 2, "l1": 1, "l2": 1}
    assert all(d["apiVersion"] == "topology.volcano.sh/v1alpha1" and d["kind"] == "HyperNode" for d in docs)
    top = next(d for d in docs if d["metadata"]["name"] == "s")
    assert top["spec"]["members"] == [
        {"type": "HyperNode", "selector": {"exactMatch": {"name": "l1"}}},
        {"type": "HyperNode", "selector": {"exactMatch": {"name": "l2"}}},
    ]
    regex = list(yaml.safe_load_all(export_volcano(topology, regex=True).text))
    l1 = next(d for d in regex if d["metadata"]["name"] == "l1")
    assert l1["spec"]["members"] == [
        {"type": "Node", "selector": {"regexMatch": {"pattern": "^gpu0(?:0[1-9]|[1-2][0-9]|3[0-2])$"}}}
    ]
    names = [f"gpu{i:03d}" for i in range(1, 41)]
    back = import_volcano(export_volcano(topology, regex=True).text, nodes=names)
    assert leaf_groups(build_hierarchy(back)) == leaf_groups(build_hierarchy(topology))


def test_native_round_trip_schema_and_published_schema_file() -> None:
    topology = x5()
    for fmt in ("json", "yaml"):
        text = export_native(topology, fmt=fmt).text  # type: ignore[arg-type]
        assert import_native(text, file=f"x5.{fmt}") == topology
    document = json.loads(export_native(topology).text)
    jsonschema.validate(document, native_schema())
    assert document["format"] == "ibpool.topology" and document["version"] == 1
    published = REPO / "docs" / "fabric-topology.schema.json"
    assert published.read_text() == native_schema_text(), "regenerate docs/fabric-topology.schema.json"


def test_export_only_selected_nodes() -> None:
    topology = x5()
    out = export_slurm_tree(topology, nodes=["sl390lin1", "sl390lin2", "r510gluster1", "nosuchnode"])
    assert out.text.splitlines()[1:] == [
        "SwitchName=tier2group-c0a5a1c0 Switches=S-0002c90200417670,S-0008f10500108bba",
        "SwitchName=S-0002c90200417670 Nodes=sl390lin[1-2]",
        "SwitchName=S-0008f10500108bba Nodes=r510gluster1",
    ]
    assert out.warnings == ["1 selected node(s) are not in the topology: nosuchnode"]
    native = import_native(export_native(topology, nodes=["sl390lin1"]).text)
    assert [h.name for h in native.hosts] == ["sl390lin1"] and len(native.switches) == 11


@pytest.mark.parametrize("kind", EXPORT_FORMATS)
def test_every_export_of_an_empty_topology_says_so(kind: str) -> None:
    if kind in ("slurm", "slurm-block"):  # slurmctld refuses a topology.conf without switches: no file
        with pytest.raises(FabricError, match="no host of the topology is cabled to a switch"):
            export_topology(kind, Topology())
        return
    exported = export_topology(kind, Topology())
    assert isinstance(exported.text, str)


def test_dispatch_by_cli_names() -> None:
    topology = import_slurm_tree(
        "SwitchName=a Nodes=n[1-2]\nSwitchName=b Nodes=n[3-4]\nSwitchName=top Switches=a,b\n", file="t.conf"
    )
    yaml_text = export_topology("slurm-yaml", topology).text
    blocks = import_topology("slurm-block", yaml_text, file="topology.yaml")
    assert sorted(s.name for s in blocks.switches) == ["a", "b"]
    assert import_topology("slurm", yaml_text, file="topology.yaml").switches != blocks.switches  # the tree
    with pytest.raises(ValueError, match="unknown input format 'xml'"):
        import_topology("xml", "", file="x")
    with pytest.raises(ValueError, match="unknown output format 'xml'"):
        export_topology("xml", topology)
    with pytest.raises(ValueError, match="a name map and a rail order apply to ibnetdiscover input only"):
        import_topology("slurm", "SwitchName=a Nodes=n1\n", file="t.conf", names={"0x1": "x"})


def test_volcano_leaves_out_hosts_that_cannot_be_kubernetes_nodes() -> None:
    # `x5570_comp1` is not a Kubernetes node name (the HyperNode CRD refuses it); a leaf holding only
    # such hosts is not written, and its parent does not name it.
    topology = import_slurm_tree(
        "SwitchName=a Nodes=x5570_comp[1-2]\nSwitchName=b Nodes=gpu[1-2],GPU2\nSwitchName=top Switches=a,b\n",
        file="t.conf",
    )
    out = export_volcano(topology)
    docs = [d for d in yaml.safe_load_all(out.text) if d]
    by_name = {d["metadata"]["name"]: d for d in docs}
    assert set(by_name) == {"top", "b"}
    assert by_name["top"]["spec"]["members"] == [{"type": "HyperNode", "selector": {"exactMatch": {"name": "b"}}}]
    nodes = [m["selector"]["exactMatch"]["name"] for m in by_name["b"]["spec"]["members"]]
    assert nodes == ["gpu1", "gpu2"]
    assert "host 'x5570_comp1' is not a valid Kubernetes node name; left out" in out.warnings
    assert any("'GPU2'" in w and "both node 'gpu2'" in w for w in out.warnings), out.warnings


# --- rails from the adapters' own numbers (issue 21) ----------------------------------------------


def test_adapter_rails_come_from_the_adapters_own_numbers() -> None:
    # a host missing HCA-2 keeps HCA-3 on the third rail, like every other host
    assert adapter_rails([("HCA-1", "0x1"), ("HCA-3", "0x3")]) == ({"0x1": 0, "0x3": 2}, True)
    assert adapter_rails([("mlx5_0", "0x9"), ("mlx5_3", "0x1")]) == ({"0x9": 0, "0x1": 3}, True)
    # names without a number (or a number twice): the host's adapters in GUID order, said so
    assert adapter_rails([("ib-b", "0x2"), ("ib-a", "0x1")]) == ({"0x1": 0, "0x2": 1}, False)
    assert adapter_rails([("mlx5_1", "0x2"), ("mlx4_1", "0x1")]) == ({"0x1": 0, "0x2": 1}, False)
    # --rails: adapter names in rail order; one not listed has no rail
    order = ["mlx5_0", "mlx5_3", "mlx5_4"]
    assert adapter_rails([("mlx5_3", "0x1"), ("mlx5_4", "0x2"), ("mlx5_5", "0x3")], order) == (
        {"0x1": 1, "0x2": 2, "0x3": None},
        True,
    )
    assert [rail_number(n) for n in ("mlx5_11", "HCA-1", "HCA-0", "mlx5_x", "eth0")] == [11, 0, None, None, None]


def test_a_host_missing_an_adapter_keeps_its_other_rails() -> None:
    fabric = generate("rail_optimised:hosts=4")
    gone = next(c for c in fabric.cas if c.host == "dgx001" and c.rail == 1)
    fabric = build_topology(
        name=fabric.name,
        hosts=fabric.hosts,
        cas=[c for c in fabric.cas if c is not gone],
        switches=fabric.switches,
        links=[ln for ln in fabric.links if gone.guid not in (ln.a.guid, ln.b.guid)],
    )
    back = import_ibnetdiscover(export_ibnetdiscover(fabric).text, file="dump")
    rails = {c.name: c.rail for c in back.cas if c.host == "dgx001"}
    assert rails == {f"mlx5_{r}": r for r in range(8) if r != 1}  # mlx5_2 is still rail 2, not 1
    assert not [w for w in back.warnings if "rail" in w]


def test_rails_given_in_order_override_the_numbers() -> None:
    topology = import_ibnetdiscover(QUANTUM, file="quantum.topo", rails=["mlx5_3", "mlx5_0"])
    assert {(c.host, c.name, c.rail) for c in topology.cas if c.host == "dgx01"} == {
        ("dgx01", "mlx5_3", 0),
        ("dgx01", "mlx5_0", 1),
    }
    with pytest.raises(ValueError, match="rail order apply to ibnetdiscover input only"):
        import_topology("slurm", "SwitchName=a Nodes=n1\n", file="t.conf", rails=["mlx5_0"])


# --- disconnected fabrics stay disconnected (issue 21) --------------------------------------------


def test_a_disconnected_fabric_keeps_its_tops_and_a_torus_gets_one_root() -> None:
    text = "SwitchName=spineA Switches=l[1-2]\nSwitchName=spineB Switches=l3\n" + "".join(
        f"SwitchName=l{i} Nodes=n{i}\n" for i in (1, 2, 3)
    )
    out = export_slurm_tree(import_slurm_tree(text, file="two.conf"))
    assert [ln for ln in out.text.splitlines() if "Switches=" in ln] == [
        "SwitchName=spineA Switches=l1,l2",
        "SwitchName=spineB Switches=l3",
    ]  # no invented root above them: slurmctld keeps warning that no switch reaches every node
    assert any("2 parts that no link joins (tops spineA, spineB)" in w for w in out.warnings)
    torus = export_slurm_tree(generate("torus_3d:x=2,y=2,z=2"))  # one part: links join every switch
    tops = [ln for ln in torus.text.splitlines() if ln.startswith("SwitchName=root ")]
    assert len(tops) == 1 and not any("parts" in w for w in torus.warnings)
    assert torus.text.count("Nodes=") == 8  # a leaf group per torus switch, as `topo show` counts them


def test_a_dragonflys_groups_are_a_level_and_a_torus_has_none() -> None:
    dragonfly = generate("dragonfly:groups=9,routers_per_group=4,hosts_per_router=2,global_links_per_router=2")
    hierarchy = build_hierarchy(dragonfly)
    (root,) = hierarchy.roots
    groups = [hierarchy.units[c] for c in hierarchy.units[root].children]
    names = {s.guid: s.name for s in dragonfly.switches}
    # one unit per group of routers, holding exactly that group's routers
    assert sorted(sorted({names[g].rsplit("-", 1)[0] for g in u.switches}) for u in groups) == [
        [f"df-g{i}"] for i in sorted(range(9), key=str)
    ]
    assert all(len(u.children) == 4 and u.name.startswith("group-") for u in groups)
    torus = build_hierarchy(generate("torus_3d:x=4,y=4,z=4"))
    assert len(torus.units[torus.roots[0]].children) == 64  # every switch right under the root
