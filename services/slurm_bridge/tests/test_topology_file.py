"""The bridge's glue without Slurm: the topology file written atomically and only on change, the
switch names compared after a reconfigure, and config errors that say which field and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibpool_runtime.config import ConfigError
from ibpool_slurm_bridge.config import SlurmBridgeConfig
from ibpool_slurm_bridge.service import bridge_config, read_names, switch_names, write_if_changed


def test_the_file_is_written_only_when_its_text_changes_and_the_one_it_replaces_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "topology.conf"
    assert write_if_changed(path, "SwitchName=a Nodes=n1\n")
    assert not (tmp_path / "topology.conf.previous").exists()  # nothing was there to keep
    assert not write_if_changed(path, "SwitchName=a Nodes=n1\n")
    assert write_if_changed(path, "SwitchName=b Nodes=n1\n")
    assert path.read_text() == "SwitchName=b Nodes=n1\n"
    assert (tmp_path / "topology.conf.previous").read_text() == "SwitchName=a Nodes=n1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["topology.conf", "topology.conf.previous"]


def test_switch_names_of_a_file_and_of_scontrol_show_topology() -> None:
    assert switch_names("SwitchName=s1 Nodes=n[1-2]\nswitchname=top Switches=s1\nBlockName=b1 Nodes=n3\n") == {
        "s1",
        "top",
        "b1",
    }
    assert switch_names("SwitchName=s1 Level=0 LinkSpeed=1 Nodes=n[1-2]") == {"s1"}


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="drain_scopes: rack not among node, gpu, rail, leaf"):
        bridge_config(SlurmBridgeConfig(drain_scopes="node,rack"))
    assert bridge_config(SlurmBridgeConfig(drain_scopes="node")).drain_scopes == frozenset({"node"})
    names = tmp_path / "names"
    names.write_text("# fabric host, Slurm node\ndgx001 gpu-a01\ndgx002 gpu-a01\n")
    with pytest.raises(
        ConfigError, match=r"names_file: .*names:3: Slurm node gpu-a01 is already the name of another host"
    ):
        read_names(SlurmBridgeConfig(names_file=str(names)))
    names.write_text("dgx001 gpu-a01\ndgx002\n")
    with pytest.raises(ConfigError, match=r"names:2: expected '<fabric host> <slurm node>'"):
        read_names(SlurmBridgeConfig(names_file=str(names)))
    with pytest.raises(ConfigError, match="names_file: cannot read"):
        read_names(SlurmBridgeConfig(names_file=str(tmp_path / "missing")))
    names.write_text("dgx001 gpu-a01\n")
    assert read_names(SlurmBridgeConfig(names_file=str(names))) == {"dgx001": "gpu-a01"}
