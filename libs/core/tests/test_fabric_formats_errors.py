"""Bad input gives a FormatError naming file, line and reason (or a warning where a partial topology
is still valid): never a traceback from deeper code."""

from __future__ import annotations

import re

import pytest

from ibpool_core.fabric.formats import FormatError, import_topology
from ibpool_core.fabric.formats.ibnetdiscover import import_ibnetdiscover, parse_name_map
from ibpool_core.fabric.formats.k8s import import_k8s_labels
from ibpool_core.fabric.formats.native import export_native, import_native
from ibpool_core.fabric.formats.slurm import import_slurm_block, import_slurm_tree, import_slurm_yaml
from ibpool_core.fabric.formats.volcano import import_volcano
from ibpool_core.fabric.model import FabricError

DUMP = """\
#
# Topology file: generated on Mon Jul 25 11:30:26 2016
#
vendid=0x2c9
devid=0xcb20
switchguid=0xe41d2d030003e470(e41d2d030003e470)
Switch\t36 "S-e41d2d030003e470"\t\t# "SwitchIB Mellanox Technologies" base port 0 lid 268 lmc 0
[3]\t"S-f4521403005764b0"[1]\t\t# "MF0;switch-de779e:SX6012/U1" lid 174 4xFDR
[34]\t"H-e41d2d030061f957"[1](e41d2d030061f957) \t\t# "r-ufm216 HCA-2" lid 2 4xEDR

vendid=0x2c9
devid=0xc738
switchguid=0xf4521403005764b0(f4521403005764b0)
Switch\t12 "S-f4521403005764b0"\t\t# "MF0;switch-de779e:SX6012/U1" enhanced port 0 lid 174 lmc 0
[1]\t"S-e41d2d030003e470"[3]\t\t# "SwitchIB Mellanox Technologies" lid 268 4xFDR
[2]\t"H-0002c9030004e938"[1](2c9030004e939) \t\t# "r-ufm101 HCA-1" lid 27 4xQDR

vendid=0x2c9
devid=0x1013
caguid=0xe41d2d030061f957
Ca\t1 "H-e41d2d030061f957"\t\t# "r-ufm216 HCA-2"
[1](e41d2d030061f957) \t"S-e41d2d030003e470"[34]\t\t# lid 2 lmc 0 "SwitchIB Mellanox Technologies" lid 268 4xEDR

vendid=0x2c9
devid=0x673c
caguid=0x2c9030004e938
Ca\t1 "H-0002c9030004e938"\t\t# "r-ufm101 HCA-1"
[1](2c9030004e939) \t"S-f4521403005764b0"[2]\t\t# lid 27 lmc 0 "MF0;switch-de779e:SX6012/U1" lid 174 4xQDR
"""


def line_number(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def raises_at(file: str, line: int | None, reason: str) -> pytest.RaisesContext[FormatError]:
    where = f"{re.escape(file)}:{line}: " if line is not None else f"{re.escape(file)}: "
    return pytest.raises(FormatError, match="^" + where + reason)


def test_the_good_dump_imports() -> None:
    topology = import_ibnetdiscover(DUMP, file="good.topo")
    assert len(topology.switches) == 2 and len(topology.hosts) == 2 and topology.warnings == []


def test_format_error_carries_file_line_and_reason_and_is_a_fabric_error() -> None:
    with pytest.raises(FabricError) as caught:
        import_ibnetdiscover("", file="empty.topo")
    error = caught.value
    assert isinstance(error, FormatError)
    assert (error.file, error.line, error.reason) == ("empty.topo", 1, "empty file: no ibnetdiscover output")
    assert str(error) == "empty.topo:1: empty file: no ibnetdiscover output"


@pytest.mark.parametrize("text", ["", "   \n\n"])
def test_empty_file(text: str) -> None:
    with raises_at("empty.topo", 1, "empty file"):
        import_ibnetdiscover(text, file="empty.topo")


def test_comments_only() -> None:
    with raises_at("comments.topo", 3, "no nodes found"):
        import_ibnetdiscover("#\n# Topology file\n#\n", file="comments.topo")


def test_truncated_in_the_middle_of_a_line() -> None:
    cut = DUMP[: DUMP.index('r-ufm101 HCA-1" lid 27') + 6]
    with raises_at("cut.topo", line_number(DUMP, '[2]\t"H-0002c9030004e938"'), "truncated dump"):
        import_ibnetdiscover(cut, file="cut.topo")


def test_truncated_after_a_node_header() -> None:
    cut = DUMP[: DUMP.index('Ca\t1 "H-0002c9030004e938"')]
    with raises_at("cut.topo", line_number(DUMP, "devid=0x673c") - 1, "truncated dump: a node header"):
        import_ibnetdiscover(cut, file="cut.topo")


def test_truncated_after_a_node_line() -> None:
    cut = DUMP[: DUMP.index("\n[1](2c9030004e939) \t") + 1]
    with raises_at("cut.topo", line_number(DUMP, 'Ca\t1 "H-0002c9030004e938"'), "truncated dump: the last node"):
        import_ibnetdiscover(cut, file="cut.topo")


def test_truncated_at_a_section_boundary_names_the_missing_node() -> None:
    cut = DUMP[: DUMP.index("vendid=0x2c9\ndevid=0x673c")]
    with raises_at(
        "cut.topo", line_number(DUMP, '[2]\t"H-0002c9030004e938"'), 'link to unknown node "H-0002c9030004e938"'
    ):
        import_ibnetdiscover(cut, file="cut.topo")


def test_link_to_unknown_guid() -> None:
    bad = DUMP.replace('[3]\t"S-f4521403005764b0"[1]', '[3]\t"S-00000000000000ff"[1]')
    with raises_at("bad.topo", 8, 'link to unknown node "S-00000000000000ff": the dump never defines it'):
        import_ibnetdiscover(bad, file="bad.topo")


def test_duplicated_guid() -> None:
    bad = DUMP.replace("caguid=0x2c9030004e938", "caguid=0xe41d2d030061f957")
    with raises_at("dup.topo", line_number(DUMP, 'Ca\t1 "H-0002c9030004e938"'), "duplicated GUID 0xe41d2d030061f957"):
        import_ibnetdiscover(bad, file="dup.topo")


def test_node_defined_twice() -> None:
    section = DUMP[DUMP.index("vendid=0x2c9\ndevid=0x673c") :]
    with raises_at("dup.topo", DUMP.count("\n") + 5, r"H-0002c9030004e938 is defined twice \(first at line 27\)"):
        import_ibnetdiscover(DUMP + "\n" + section, file="dup.topo")


def test_port_beyond_the_radix() -> None:
    bad = DUMP.replace('[2]\t"H-0002c9030004e938"[1]', '[13]\t"H-0002c9030004e938"[1]')
    with raises_at("radix.topo", 16, "port 13 is beyond the 12 ports of S-f4521403005764b0"):
        import_ibnetdiscover(bad, file="radix.topo")


def test_remote_port_beyond_the_remote_radix() -> None:
    bad = DUMP.replace('"S-f4521403005764b0"[2]\t\t# lid 27', '"S-f4521403005764b0"[20]\t\t# lid 27')
    line = line_number(DUMP, '[1](2c9030004e939) \t"S-f4521403005764b0"[2]')
    with raises_at("radix.topo", line, "port 20 is beyond the 12 ports of S-f4521403005764b0"):
        import_ibnetdiscover(bad, file="radix.topo")


def test_the_two_ends_of_a_link_disagree() -> None:
    bad = DUMP.replace('"S-f4521403005764b0"[2]\t\t# lid 27', '"S-f4521403005764b0"[5]\t\t# lid 27')
    line = line_number(DUMP, '[1](2c9030004e939) \t"S-f4521403005764b0"[2]')
    first = line_number(DUMP, '[2]\t"H-0002c9030004e938"[1]')
    reason = r"H-0002c9030004e938\[1\] is cabled to S-f4521403005764b0\[5\] here but to S-f4521403005764b0\[2\]"
    with raises_at("ends.topo", line, reason + f" at line {first}"):
        import_ibnetdiscover(bad, file="ends.topo")


def test_port_listed_twice() -> None:
    bad = DUMP.replace("[34]\t", "[3]\t")
    with raises_at("twice.topo", 9, r"port 3 of S-e41d2d030003e470 is listed twice \(first at line 8\)"):
        import_ibnetdiscover(bad, file="twice.topo")


def test_unreadable_port_line() -> None:
    bad = DUMP.replace('[3]\t"S-f4521403005764b0"[1]', "[3]\tS-f4521403005764b0 port 1")
    with raises_at("bad.topo", 8, "cannot read this line"):
        import_ibnetdiscover(bad, file="bad.topo")


def test_a_dump_with_no_switches_is_an_empty_topology_with_a_warning() -> None:
    text = (
        'caguid=0x2c9030004e938\nCa\t1 "H-0002c9030004e938"\t\t# "a HCA-1"\n'
        '[1](2c9030004e939) \t"H-0002c9030004e940"[1] (2c9030004e941) \t\t# lid 1 lmc 0 "b HCA-1" lid 2 4xQDR\n\n'
        'caguid=0x2c9030004e940\nCa\t1 "H-0002c9030004e940"\t\t# "b HCA-1"\n'
        '[1](2c9030004e941) \t"H-0002c9030004e938"[1] (2c9030004e939) \t\t# lid 2 lmc 0 "a HCA-1" lid 1 4xQDR\n'
    )
    topology = import_ibnetdiscover(text, file="b2b.topo")
    assert topology.switches == [] and topology.hosts == []
    assert topology.warnings == ["b2b.topo: no switches in the dump: the topology is empty"]


def test_a_link_listed_from_one_side_only_is_a_warning() -> None:
    one_sided = DUMP.replace(
        '[1](2c9030004e939) \t"S-f4521403005764b0"[2]\t\t# lid 27 lmc 0 "MF0;switch-de779e:SX6012/U1" lid 174 4xQDR\n',
        "",
    )
    one_sided = one_sided.replace('Ca\t1 "H-0002c9030004e938"\t\t# "r-ufm101 HCA-1"\n', "")
    one_sided = one_sided.replace("vendid=0x2c9\ndevid=0x673c\ncaguid=0x2c9030004e938\n", "")
    one_sided = one_sided.replace(
        '[2]\t"H-0002c9030004e938"[1](2c9030004e939) \t\t# "r-ufm101 HCA-1" lid 27 4xQDR\n', ""
    )
    topology = import_ibnetdiscover(one_sided, file="ok.topo")
    assert topology.warnings == []
    half = DUMP.replace('[34]\t"H-e41d2d030061f957"[1](e41d2d030061f957) \t\t# "r-ufm216 HCA-2" lid 2 4xEDR\n', "")
    topology = import_ibnetdiscover(half, file="half.topo")
    line = line_number(half, '[1](e41d2d030061f957) \t"S-e41d2d030003e470"[34]')
    assert topology.warnings == [
        f"half.topo:{line}: link H-e41d2d030061f957[1] - S-e41d2d030003e470[34] is listed from one side only"
    ]


def test_ports_report_truncated_and_bad_lines() -> None:
    good = (
        "CA    2  1 0x1070fd0300aabb00 4x HDR - SW     1  1 0xb8cef60300a1b2c0 ( 'dgx01 mlx5_0' - 'sw' )\n"
        "SW     1  1 0xb8cef60300a1b2c0 4x HDR - CA     2  1 0x1070fd0300aabb00 ( 'sw' - 'dgx01 mlx5_0' )\n"
    )
    assert len(import_ibnetdiscover(good, file="p.txt").links) == 1
    with raises_at("p.txt", 2, "truncated dump"):
        import_ibnetdiscover(good[:-30], file="p.txt")
    with raises_at("p.txt", 2, "cannot read this line of a ports report"):
        import_ibnetdiscover(good.replace("\n", "\nnonsense\n", 1), file="p.txt")
    unknown = good.replace("0x1070fd0300aabb00 ( 'sw'", "0x1070fd0300aabbff ( 'sw'")
    with raises_at("p.txt", 2, 'link to unknown node "H-1070fd0300aabbff"'):
        import_ibnetdiscover(unknown, file="p.txt")


def test_bad_name_map() -> None:
    with raises_at("x.map", 2, "'zz-top' is not a GUID"):
        parse_name_map("H-0002c90300080e84 a\nzz-top b\n", file="x.map")
    with raises_at("x.map", 1, "expected 'GUID name'"):
        parse_name_map("H-0002c90300080e84\n", file="x.map")


# --- Slurm ---------------------------------------------------------------------------------------


def test_slurm_undefined_switch() -> None:
    text = "SwitchName=s1 Nodes=n[1-2]\nSwitchName=top Switches=s[1-2]\n"
    with raises_at("t.conf", 2, "switch s2, a child of top, is not defined"):
        import_slurm_tree(text, file="t.conf")
    lenient = import_slurm_tree(text, file="t.conf", strict=False)
    assert lenient.warnings == ["t.conf:2: switch s2, a child of top, is not defined; left out"]


def test_slurm_cycle() -> None:
    text = "SwitchName=a Switches=b\nSwitchName=b Switches=c\nSwitchName=c Switches=a,l\nSwitchName=l Nodes=n1\n"
    with raises_at("c.conf", 3, r"switches list each other in a cycle \(a -> b -> c -> a\): not a tree"):
        import_slurm_tree(text, file="c.conf")
    with raises_at("self.conf", 1, "switch a lists itself: not a tree"):
        import_slurm_tree("SwitchName=a Switches=a\n", file="self.conf")


def test_slurm_switch_defined_twice_bad_hostlist_and_unknown_line() -> None:
    with raises_at("d.conf", 2, r"switch s is defined twice \(first at line 1\)"):
        import_slurm_tree("SwitchName=s Nodes=a\nSwitchName=s Nodes=b\n", file="d.conf")
    with raises_at("h.conf", 1, r"bad hostlist 'gpu\[001-'"):
        import_slurm_tree("SwitchName=s Nodes=gpu[001-\n", file="h.conf")
    with raises_at("u.conf", 2, "expected SwitchName=, BlockName= or BlockSizes="):
        import_slurm_tree("SwitchName=s Nodes=a\nNodeName=x\n", file="u.conf")
    with raises_at("e.conf", 1, "empty file"):
        import_slurm_tree("", file="e.conf")
    with raises_at("m.conf", 2, "a file with both SwitchName= .tree. and BlockName="):
        import_slurm_tree("SwitchName=s Nodes=a\nBlockName=b Nodes=c\n", file="m.conf")


def test_slurm_tree_warnings_for_what_slurmctld_frowns_at() -> None:
    text = "SwitchName=l1 Nodes=n[1-2]\nSwitchName=l2 Nodes=n[2-3]\n"
    text += "SwitchName=s1 Switches=l1\nSwitchName=s2 Switches=l1,l2\n"
    topology = import_slurm_tree(text, file="w.conf")
    assert topology.warnings == [
        "w.conf:1: switch l1 has several parents (s1, s2): not a tree",
        "w.conf: 2 top-level switches (s1, s2): no single switch reaches every node",
        "w.conf:2: node n2 is under both l1 and l2",
    ]
    # n2 sits under two leaves: two CAs (rails); the export puts it under one leaf group and is a tree
    assert sorted(c.rail for c in topology.cas if c.host == "n2") == [0, 1]


def test_slurm_block_errors() -> None:
    with raises_at("b.conf", 2, "node n2 is in blocks b1 and b2"):
        import_slurm_block("BlockName=b1 Nodes=n[1-2]\nBlockName=b2 Nodes=n[2-3]\n", file="b.conf")
    with raises_at("b.conf", 2, "BlockSizes=4,x is not a list of numbers"):
        import_slurm_block("BlockName=b1 Nodes=n[1-4]\nBlockSizes=4,x\n", file="b.conf")
    topology = import_slurm_block(
        "BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-6]\nBlockSizes=4,12\n", file="b.conf"
    )
    assert topology.warnings == ["b.conf:3: BlockSizes=[4, 12]: each size must be a power of two times the one before"]
    with raises_at("t.conf", None, "no BlockName= lines"):
        import_slurm_block("SwitchName=s Nodes=a\n", file="t.conf")


def test_slurm_yaml_errors() -> None:
    with raises_at("t.yaml", 4, "not valid YAML"):
        import_slurm_yaml("- topology: a\n  tree:\n    switches: [\n  - x\n", file="t.yaml")
    with raises_at("t.yaml", 1, "topology.yaml must be a list"):
        import_slurm_yaml("topology: a\n", file="t.yaml")
    text = "- topology: t\n  tree:\n    switches:\n    - switch: top\n      children: s1\n"
    with raises_at("t.yaml", 4, "switch s1, a child of top, is not defined"):
        import_slurm_yaml(text, file="t.yaml")
    with raises_at("t.yaml", None, "no topology named 'x'"):
        import_slurm_yaml(text, file="t.yaml", topology="x")
    with raises_at("f.yaml", 1, "no tree or block topology"):
        import_slurm_yaml("- topology: f\n  flat: true\n", file="f.yaml")


# --- other formats -------------------------------------------------------------------------------


def test_native_errors() -> None:
    with raises_at("n.json", 3, "not valid JSON"):
        import_native('{\n  "format": "ibpool.topology",\n  "topology": {,\n}', file="n.json")
    with raises_at(
        "n.json", None, r"not an ibpool topology: Expected `int`, got `str` - at `\$.topology.switches\[0\].radix`"
    ):
        import_native('{"topology": {"switches": [{"guid": "0x1", "name": "s", "radix": "x"}]}}', file="n.json")
    with raises_at("n.json", None, "version 9 is not supported"):
        import_native('{"format": "ibpool.topology", "version": 9, "topology": {}}', file="n.json")
    with raises_at("n.yaml", None, "link .* ends at unknown GUID"):
        import_native(
            "topology:\n  links:\n  - a: ['0x0000000000000001', 1]\n    b: ['0x0000000000000002', 1]\n",
            file="n.yaml",
        )
    with raises_at("n.yaml", 1, "empty file"):
        import_native("", file="n.yaml")
    assert import_native(export_native(import_native("{}")).text).hosts == []


def test_k8s_and_volcano_errors() -> None:
    with raises_at("l.yaml", 2, "expected a Node object"):
        import_k8s_labels("---\nkind: Node\nspec: {}\n", file="l.yaml")
    conflict = (
        "metadata: {name: a, labels: {ibpool.io/spine: s1, ibpool.io/leaf: l1}}\n---\n"
        "metadata: {name: b, labels: {ibpool.io/spine: s2, ibpool.io/leaf: l1}}\n"
    )
    with raises_at("l.yaml", 3, r"l1 is under s1 \(line 1\) and under s2 here"):
        import_k8s_labels(conflict, file="l.yaml")
    with raises_at("h.yaml", 1, "switch b, a child of a, is not defined"):
        import_volcano(
            "apiVersion: topology.volcano.sh/v1alpha1\nkind: HyperNode\nmetadata: {name: a}\n"
            "spec: {tier: 2, members: [{type: HyperNode, selector: {exactMatch: {name: b}}}]}\n",
            file="h.yaml",
        )


@pytest.mark.parametrize("kind", ["ibnetdiscover", "slurm", "slurm-block", "native", "k8s-labels", "volcano"])
def test_garbage_never_gives_a_traceback(kind: str) -> None:
    for garbage in ("\x00\x01 nonsense [", "{[", "- - -\n  : :", "SwitchName=", 'Switch 0 "x"'):
        try:
            import_topology(kind, garbage, file="garbage")
        except FormatError as error:
            assert str(error).startswith("garbage")


def test_a_dump_with_no_host_cabled_to_a_switch_exports_no_slurm_file_and_says_why() -> None:
    # One adapter, no cable, no switches (a dump of it is refused: see below): slurmctld refuses an
    # empty topology.conf ("No switches configured"), so the tree and block exports refuse too; the
    # yaml export keeps a flat topology.
    from ibpool_core.fabric.formats.slurm import export_slurm_block, export_slurm_tree, export_slurm_yaml
    from ibpool_core.fabric.model import Ca, Host, build_topology

    dump = build_topology(
        name="lonely", hosts=[Host(name="lonely")], cas=[Ca(guid="0x0002c903000e0b72", host="lonely")]
    )
    for export in (export_slurm_tree, export_slurm_block):
        with pytest.raises(FabricError, match="no host of the topology is cabled to a switch"):
            export(dump)
    assert "flat: true" in export_slurm_yaml(dump).text


def test_a_dump_of_one_adapter_without_port_lines_is_refused() -> None:
    # issue 21: this was "ok" (exit 0) and an empty topology.conf that slurmctld rejects
    one = 'vendid=0x2c9\ndevid=0x1017\ncaguid=0x1070fd0300aabb00\nCa\t1 "H-1070fd0300aabb00"\t\t# "dgx01 mlx5_0"\n'
    with raises_at("one.topo", 4, "truncated dump: the last node H-1070fd0300aabb00 has no port lines"):
        import_ibnetdiscover(one, file="one.topo")
