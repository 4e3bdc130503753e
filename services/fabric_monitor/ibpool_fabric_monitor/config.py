"""Fabric monitor configuration (env `IBPOOL_FABRIC_MONITOR_<FIELD>` or TOML `[fabric_monitor]`)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from ibpool_runtime.config import BaseConfig


class FabricMonitorConfig(BaseConfig, frozen=True, kw_only=True):
    # Where the topology comes from: a file (native JSON/YAML, ibnetdiscover, Slurm) or a generator spec.
    topology_file: str = ""
    topology_format: Literal["auto", "native", "ibnetdiscover", "slurm"] = "auto"
    names_file: str = ""
    generate: str = "rail_optimised:hosts=16"
    # Rename generated hosts host 1..N with this format, e.g. "node-{:03d}" to match the node agents.
    host_name_format: str = ""
    # Re-import the topology file every N seconds (0: never); a new version only when the hash changes.
    rediscover_interval_s: float = 0.0
    # Instead of a file: a command whose output is an ibnetdiscover dump, e.g. "ibnetdiscover".
    discover_command: str = ""
    # agents: the ports node agents read from their hosts' sysfs and report (HcaPortsReported).
    counter_source: Literal["simulated", "sysfs", "perfquery", "agents", "none"] = "simulated"
    sysfs_root: str = "/"
    perfquery_command: str = "perfquery -G {guid} {port}"
    # Hosts whose adapters' links perfquery watches (comma-separated); empty: every link.
    perfquery_hosts: str = ""
    poll_interval_s: Annotated[float, msgspec.Meta(gt=0.0)] = 5.0
    seed: int = 0
    flap_changes: int = 3
    flap_window_s: float = 60.0
    errors_per_s: float = 1.0
    congestion_ratio: float = 0.5
    clear_after_s: float = 30.0
    # Counter samples kept per link: a ring of this many polls (state.record_samples).
    history_per_link: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 120
    # Topology versions kept (each holds the whole topology); older ones are deleted when a new one is made.
    topology_versions_kept: Annotated[int, msgspec.Meta(ge=1)] = 100
    # Base URL others use to fetch topologies (goes into TopologyPublished); empty: this service's own.
    public_url: str = ""
