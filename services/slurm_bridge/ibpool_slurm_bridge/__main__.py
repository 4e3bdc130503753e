"""`python -m ibpool_slurm_bridge`; config from env (`IBPOOL_SLURM_BRIDGE_*`) or TOML."""

from __future__ import annotations

import sys

from ibpool_runtime.service import run_service

from .bootstrap import bootstrap
from .config import SlurmBridgeConfig

if __name__ == "__main__":
    sys.exit(run_service("slurm_bridge", SlurmBridgeConfig, bootstrap))
