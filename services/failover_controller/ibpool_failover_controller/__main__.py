"""`python -m ibpool_failover_controller`; config from env (`IBPOOL_FAILOVER_CONTROLLER_*`) or TOML."""

from __future__ import annotations

import sys

from ibpool_runtime.service import run_service

from .bootstrap import bootstrap
from .config import FailoverControllerConfig

if __name__ == "__main__":
    sys.exit(run_service("failover_controller", FailoverControllerConfig, bootstrap))
