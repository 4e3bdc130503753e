"""Loading the fabric monitor's topology from real dumps, Slurm files, native files and generators."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibpool_core.fabric.formats import export_topology
from ibpool_core.fabric.generators import generate
from ibpool_fabric_monitor.config import FabricMonitorConfig
from ibpool_fabric_monitor.topology_source import TopologySourceError, topology_loader
from ibpool_sim.shared_data import need


def test_real_dump_with_a_name_map() -> None:
    dump, names = need("fabrics/psmn-x5/X5.topofile"), need("fabrics/psmn-x5/X5.map")
    t = topology_loader(FabricMonitorConfig(topology_file=str(dump), names_file=str(names)))()
    assert len(t.switches) == 11 and "r510gluster1" in {h.name for h in t.hosts}


def test_native_and_slurm_files_by_extension_or_content(tmp_path: Path) -> None:
    fabric = generate("fat_tree_2tier:hosts=8,radix=8")
    native = tmp_path / "fabric.json"
    native.write_text(export_topology("native", fabric).text)
    assert topology_loader(FabricMonitorConfig(topology_file=str(native)))() == fabric
    conf = tmp_path / "topology.conf"
    conf.write_text(export_topology("slurm", fabric).text)
    assert {h.name for h in topology_loader(FabricMonitorConfig(topology_file=str(conf)))().hosts} == {
        h.name for h in fabric.hosts
    }


def test_generated_hosts_take_the_node_agents_names() -> None:
    t = topology_loader(FabricMonitorConfig(generate="rail_optimised:hosts=4", host_name_format="node-{:03d}"))()
    assert [h.name for h in t.hosts] == ["node-001", "node-002", "node-003", "node-004"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"topology_file": "no/such/file.topo"}, "No such file"),
        ({"generate": "warp_drive"}, "unknown generator"),
    ],
)
def test_bad_sources_say_what_and_where(config: dict[str, str], message: str) -> None:
    with pytest.raises(TopologySourceError, match=message):
        topology_loader(FabricMonitorConfig(**config))()


def test_broken_dump_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.topo"
    bad.write_text('Switch  24 "S-005442ba00003080"  # "ISR9024" base port 0 lid 6 lmc 0\n[99] "H-1"[1]\n')
    with pytest.raises(TopologySourceError, match=r"broken\.topo:"):
        topology_loader(FabricMonitorConfig(topology_file=str(bad)))()


def test_discovery_command_output_is_imported() -> None:
    dump = need("fabrics/ibtopotool/1.topo")
    t = topology_loader(FabricMonitorConfig(discover_command=f"cat {dump}"))()
    assert len(t.switches) == 2
    with pytest.raises(TopologySourceError, match="exited 1"):
        topology_loader(FabricMonitorConfig(discover_command="false"))()
