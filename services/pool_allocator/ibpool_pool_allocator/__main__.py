"""`python -m ibpool_pool_allocator`; config from env (`IBPOOL_POOL_ALLOCATOR_*`) or TOML."""

from __future__ import annotations

import sys

from ibpool_runtime.service import run_service

from .bootstrap import bootstrap
from .config import PoolAllocatorConfig

if __name__ == "__main__":
    sys.exit(run_service("pool_allocator", PoolAllocatorConfig, bootstrap))
