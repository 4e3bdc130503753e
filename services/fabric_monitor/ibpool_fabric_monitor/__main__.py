"""`python -m ibpool_fabric_monitor`; config from env (`IBPOOL_FABRIC_MONITOR_*`) or TOML."""

from __future__ import annotations

import sys

from ibpool_runtime.service import run_service

from .bootstrap import bootstrap
from .config import FabricMonitorConfig

if __name__ == "__main__":
    sys.exit(run_service("fabric_monitor", FabricMonitorConfig, bootstrap))
