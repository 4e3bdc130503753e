"""`python -m ibpool_autoscaler`; config from env (`IBPOOL_AUTOSCALER_*`) or TOML."""

from __future__ import annotations

import sys

from ibpool_runtime.service import run_service

from .bootstrap import bootstrap
from .config import AutoscalerConfig

if __name__ == "__main__":
    sys.exit(run_service("autoscaler", AutoscalerConfig, bootstrap))
