"""Slurm bridge configuration (env `IBPOOL_SLURM_BRIDGE_<FIELD>` or TOML `[slurm_bridge]`)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from ibpool_runtime.config import BaseConfig, Positive


class SlurmBridgeConfig(BaseConfig, frozen=True, kw_only=True):
    # The slurm.conf scontrol reads (its SLURM_CONF); empty: Slurm's default.
    slurm_conf: str = ""
    scontrol: str = "scontrol"
    scontrol_timeout_s: Positive = 10.0
    # Where to write the topology file (in slurm.conf's directory); empty: leave the topology alone.
    topology_file: str = ""
    # slurm: topology/tree; slurm-block: topology/block (Slurm 23.11+); slurm-yaml: topology.yaml (25.05+).
    topology_format: Literal["slurm", "slurm-block", "slurm-yaml"] = "slurm"
    # Run `scontrol reconfigure` after writing a new topology file (and check that Slurm took it).
    reconfigure: bool = True
    # Fabric host name -> Slurm node name where they differ: lines '<fabric host> <slurm node>'.
    names_file: str = ""
    # The cordon scopes that drain a Slurm node, comma-separated (node, gpu, rail, leaf).
    drain_scopes: str = "node,gpu,rail,leaf"
    # ibpool never holds more than max(min_drains_allowed, floor(fraction * nodes)) Slurm nodes drained
    # (the fraction: the failover controller's split-brain guard, max_failed_fraction).
    max_drain_fraction: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.2
    min_drains_allowed: Annotated[int, msgspec.Meta(ge=0)] = 2
    # Slurm's view is read back at least this often (and at once after a cordon changes).
    sync_interval_s: Positive = 5.0
    # scontrol updates per round at most (the rest wait for the next round).
    max_actions_per_round: Annotated[int, msgspec.Meta(ge=1)] = 50
    fetch_timeout_s: Positive = 10.0
    durable_prefix: str = "slurm-bridge"
