"""Where the shared data sets written by others live: `../shared/data` beside the repository.

`IBPOOL_SHARED_DATA` overrides the location. Tests that need a file call `require()`: it skips
when the data is absent, and fails instead when `IBPOOL_REQUIRE_SHARED_DATA=1` (as CI sets).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


class SharedDataMissing(Exception):
    pass


def shared_data_dir() -> Path:
    override = os.environ.get("IBPOOL_SHARED_DATA")
    return Path(override) if override else REPO_ROOT.parent / "shared" / "data"


def locate(relative: str) -> Path | None:
    path = shared_data_dir() / relative
    return path if path.exists() else None


def required() -> bool:
    return os.environ.get("IBPOOL_REQUIRE_SHARED_DATA") == "1"


def need(relative: str) -> Path:
    """For tests: the path of a shared data file; skip when absent, fail when it is required."""
    import pytest

    path = locate(relative)
    if path is None:
        message = f"shared data {relative} not found under {shared_data_dir()}"
        if required():
            pytest.fail(message + " and IBPOOL_REQUIRE_SHARED_DATA=1")
        pytest.skip(message)
    return path
