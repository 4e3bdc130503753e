"""`python -m ibpool_scheduler`; config from env (`IBPOOL_SCHEDULER_*`) or TOML."""

from __future__ import annotations

import sys

from ibpool_runtime.service import run_service

from .bootstrap import bootstrap
from .config import SchedulerConfig

if __name__ == "__main__":
    sys.exit(run_service("scheduler", SchedulerConfig, bootstrap))
