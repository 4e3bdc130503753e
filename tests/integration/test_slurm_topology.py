"""Every Slurm topology.conf ibpool writes, read by a real slurmctld (Debian's 22.05).

For each fabric (the shared real dumps, every generator at a small and a large size, host names
that Slurm's hostlist parser is particular about, a disconnected fabric) the tree export is given
to a throw-away slurmctld with a generated slurm.conf listing the file's nodes. It must start,
complain about nothing in its log, and `scontrol show topology` must list every node under exactly
one leaf switch, expanded by `scontrol show hostnames` (Slurm's own parser, not ours); the number
of top-level switches is the number of parts of the fabric.

topology/block and topology.yaml need Slurm 23.11 / 25.05, newer than Debian bookworm's: those
exports of the same fabrics are checked against the rules of SchedMD's topology.conf(5) and
topology.yaml(5) (below), their node lists expanded by `scontrol show hostnames`."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from ibpool_core.fabric.formats import export_topology, import_topology, parse_name_map
from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.graph import Graph
from ibpool_core.fabric.model import Topology, rename_hosts, unnamed_host
from ibpool_runtime import slurmstack
from ibpool_sim.shared_data import need
from tests.integration.slurm_support import log_complaints, munge_socket

__all__ = ["munge_socket"]

pytestmark = pytest.mark.integration


def dump(path: str, names: str | None = None) -> Callable[[], Topology]:
    def load() -> Topology:
        file = need(path)
        name_map = parse_name_map(need(names).read_text(), file=names) if names else None
        return import_topology("ibnetdiscover", file.read_text(errors="replace"), file=str(file), names=name_map)

    return load


def generated(spec: str) -> Callable[[], Topology]:
    return lambda: generate(spec)


# Host names Slurm's hostlist parser is particular about (issue 21): text after a number, dots,
# padding widths side by side, a name without a number.
CORNER_NAMES = [
    "node01-ib", "node02-ib", "n1.lan", "n2.lan", "r1n1", "r1n2", "r2n1", "dgx-a100-001",
    "dgx-a100-002", "dgx-a100-010", "gpu001", "gpu100", "x", "c0", "c00", "c000",
]  # fmt: skip


def corner_names() -> Topology:
    fabric = generate("fat_tree_2tier:hosts=16,radix=8")
    return rename_hosts(fabric, dict(zip(sorted(h.name for h in fabric.hosts), CORNER_NAMES, strict=True)))


def disconnected() -> Topology:
    text = "SwitchName=spineA Switches=l[1-2]\nSwitchName=spineB Switches=l3\n" + "".join(
        f"SwitchName=l{i} Nodes=n{i}[1-3]\n" for i in (1, 2, 3)
    )
    return import_topology("slurm", text, file="two-parts.conf")


FABRICS: dict[str, tuple[Callable[[], Topology], int]] = {  # name -> (topology, parts)
    **{f"ibtopotool/{n}": (dump(f"fabrics/ibtopotool/{n}"), 1) for n in ("2.topo", "3.topo", "4.topo")},
    **{
        f"ibsim/{n}": (dump(f"fabrics/ibsim/{n}"), 1)
        for n in ("net", "net.1", "net.2sw2path", "net.2sw2path4hca", "net.2sw2path4hca2port")
    },
    "psmn-x5 with X5.map": (dump("fabrics/psmn-x5/X5.topofile", "fabrics/psmn-x5/X5.map"), 1),
    "single_switch 4": (generated("single_switch:hosts=4"), 1),
    "single_switch 64": (generated("single_switch:hosts=64"), 1),
    "fat_tree_2tier 40": (generated("fat_tree_2tier:hosts=40"), 1),
    "fat_tree_2tier 2048": (generated("fat_tree_2tier:hosts=2048"), 1),
    "fat_tree_3tier 100": (generated("fat_tree_3tier:hosts=100,radix=16"), 1),
    "fat_tree_3tier 8192": (generated("fat_tree_3tier:hosts=8192"), 1),
    "rail_optimised 32": (generated("rail_optimised:hosts=32"), 1),
    "rail_optimised 1024": (generated("rail_optimised:hosts=1024"), 1),
    "torus_3d 2x2x2": (generated("torus_3d:x=2,y=2,z=2"), 1),
    "torus_3d 8x8x8x2": (generated("torus_3d:x=8,y=8,z=8,hosts_per_switch=2"), 1),
    "dragonfly 3x2x2": (
        generated("dragonfly:groups=3,routers_per_group=2,hosts_per_router=2,global_links_per_router=1"),
        1,
    ),
    "dragonfly 17x8x8": (
        generated("dragonfly:groups=17,routers_per_group=8,hosts_per_router=8,global_links_per_router=2"),
        1,
    ),
    "hostlist corner cases": (corner_names, 1),
    "two parts no link joins": (disconnected, 2),
}


def exported_nodes(topology: Topology) -> list[str]:
    """The hosts the Slurm exports hold: named and cabled to a switch."""
    return sorted(h for h, leaves in Graph(topology).host_leaves().items() if leaves and not unnamed_host(h))


def slurm_topology(text: str) -> tuple[list[str], list[str]]:
    """(the Nodes= hostlists of the leaf switches, the top-level switch names) of `scontrol show topology`."""
    leaves: list[str] = []
    children: set[str] = set()
    names: list[str] = []
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "SwitchName" not in fields:
            continue
        names.append(fields["SwitchName"])
        if fields.get("Level") == "0":
            leaves.append(fields["Nodes"])
        children.update(c for c in re.split(r",(?![^\[]*\])", fields.get("Switches", "")) if c)
    return leaves, [n for n in names if n not in children]


@pytest.mark.parametrize("name", sorted(FABRICS))
def test_slurmctld_accepts_the_tree_export_with_every_node_under_one_leaf(
    name: str, munge_socket: Path, tmp_path: Path
) -> None:
    build, parts = FABRICS[name]
    topology = build()
    exported = export_topology("slurm", topology)
    nodes = exported_nodes(topology)
    assert nodes, "a fabric with hosts to export"
    with slurmstack.cluster(tmp_path / "slurm", munge_socket, nodes, topology=exported.text) as slurm:
        leaves, tops = slurm_topology(slurm.scontrol("show", "topology"))
        # Slurm's own expansion of every leaf's hostlist, duplicates kept: each node exactly once
        placed = slurm.scontrol("show", "hostnames", ",".join(leaves)).split()
        assert sorted(placed) == nodes
        assert len(tops) == parts, tops
        complaints = log_complaints(slurm.log_text())
    if parts == 1:
        assert complaints == []
    else:  # the one thing Slurm says of a disconnected fabric, and what ibpool warned of
        assert len(complaints) == 1 and "no switch can reach all nodes" in complaints[0]
        assert any(f"{parts} parts that no link joins" in w for w in exported.warnings)


# --- topology/block and topology.yaml, against the syntax of topology.conf(5) and topology.yaml(5) -----
# (Slurm 23.11 / 25.05 read them; Debian bookworm's 22.05 does not, so the rules of the pages are checked
# here, with node lists expanded by Slurm's own hostlist parser.)

POWER_OF_TWO = {2**k for k in range(1, 40)}


def check_block_sizes(sizes: list[int], block_nodes: list[int]) -> None:
    """BlockSizes: the planning base first, every block at least that many nodes, each next size a
    power of two times the one before."""
    assert sizes and all(isinstance(s, int) and s > 0 for s in sizes), sizes
    assert min(block_nodes) >= sizes[0], (sizes, min(block_nodes))
    assert all(b // a in POWER_OF_TWO and b % a == 0 for a, b in itertools.pairwise(sizes)), sizes


@pytest.mark.parametrize("name", sorted(FABRICS))
def test_block_and_yaml_exports_follow_slurms_pages_with_every_node_once(
    name: str, munge_socket: Path, tmp_path: Path
) -> None:
    build, _ = FABRICS[name]
    topology = build()
    nodes = exported_nodes(topology)
    conf = tmp_path / "slurm.conf"  # for scontrol's hostlist expansion only; no daemon reads it
    conf.write_text(slurmstack.conf_text(tmp_path, munge_socket, nodes[:1], controller_port=1, node_ports={},
                                         topology=False, spool=tmp_path))  # fmt: skip
    slurm = slurmstack.Cluster(folder=tmp_path, conf=conf, slurmctld_pid=0)

    def expand(hostlists: list[str]) -> list[str]:
        return sorted(slurm.scontrol("show", "hostnames", ",".join(hostlists)).split())

    # topology.conf, topology/block: BlockName= Nodes= lines and one BlockSizes= line
    block = export_topology("slurm-block", topology).text
    names, lists, sizes = [], [], None
    for line in block.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = dict(f.split("=", 1) for f in line.split())
        if "BlockSizes" in fields:
            assert sizes is None and set(fields) == {"BlockSizes"}, line
            sizes = [int(s) for s in fields["BlockSizes"].split(",")]
        else:
            assert set(fields) == {"BlockName", "Nodes"} and fields["BlockName"], line
            names.append(fields["BlockName"])
            lists.append(fields["Nodes"])
    assert len(names) == len(set(names)) and sizes is not None
    assert expand(lists) == nodes  # every node in exactly one block
    check_block_sizes(sizes, [len(expand([n])) for n in lists])

    # topology.yaml: a list of topologies, `topology` first, exactly one of block / flat / tree
    document = yaml.safe_load(export_topology("slurm-yaml", topology).text)
    assert isinstance(document, list) and document
    assert len({t["topology"] for t in document}) == len(document)
    assert sum(1 for t in document if t.get("cluster_default") is True) == 1
    for t in document:
        assert next(iter(t)) == "topology" and set(t) - {"topology", "cluster_default"} in (
            {"block"},
            {"flat"},
            {"tree"},
        )
        if "tree" in t:
            switches = t["tree"]["switches"]
            names = [s["switch"] for s in switches]
            assert len(names) == len(set(names)) and all(0 < len(n) <= 64 for n in names)
            assert all(set(s) - {"switch"} in ({"nodes"}, {"children"}) for s in switches)
            assert expand([s["nodes"] for s in switches if "nodes" in s]) == nodes
            known = set(names)
            assert all(c in known for s in switches if "children" in s for c in s["children"].split(","))
        if "block" in t:
            blocks = t["block"]["blocks"]
            assert len({b["block"] for b in blocks}) == len(blocks) and all(
                set(b) == {"block", "nodes"} for b in blocks
            )
            assert expand([b["nodes"] for b in blocks]) == nodes
            check_block_sizes(t["block"]["block_sizes"], [len(expand([b["nodes"]])) for b in blocks])
