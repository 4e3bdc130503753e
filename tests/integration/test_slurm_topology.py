"""Every Slurm topology.conf ibpool writes, read by a real slurmctld (Debian's 22.05).

For each fabric (the shared real dumps, every generator at a small and a large size, host names
that Slurm's hostlist parser is particular about, a disconnected fabric) the tree export is given
to a throw-away slurmctld with a generated slurm.conf listing the file's nodes. It must start,
complain about nothing in its log, and `scontrol show topology` must list every node under exactly
one leaf switch, expanded by `scontrol show hostnames` (Slurm's own parser, not ours); the number
of top-level switches is the number of parts of the fabric.

topology/block and topology.yaml need Slurm 23.02 / 25.05, newer than Debian bookworm's: those
exports are checked against the syntax of topology.conf(5) / topology.yaml(5) in
libs/core/tests (docs/fabric-formats.md says so)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

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
    nodes = sorted(h for h, leaves in Graph(topology).host_leaves().items() if leaves and not unnamed_host(h))
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
