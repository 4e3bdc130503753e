"""A longer hunt (IBPOOL_FUZZ_EXAMPLES, IBPOOL_ATHERIS_SECONDS raised) gets a longer per-test timeout."""

from __future__ import annotations

import os

import pytest

from tests.fuzz.budget import EXAMPLES


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    atheris_s = int(os.environ.get("IBPOOL_ATHERIS_SECONDS", "2"))
    limit = 180 + EXAMPLES // 10 + 2 * atheris_s
    for item in items:
        if "tests/fuzz/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.timeout(limit))
