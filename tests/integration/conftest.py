"""One embedded stack (real nats-server with JetStream, real PostgreSQL) per test session."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ibpool_runtime import devstack, telemetry
from ibpool_runtime.bus import Bus
from ibpool_runtime.store import Store
from tests.integration.helpers import own_store

telemetry.setup_tracing("ibpool-tests", in_memory=True)


def stack_dir() -> Path:
    """A state dir outside pytest's tmp root, whose permissions pytest resets to 0700 (which
    would lock out the unprivileged user PostgreSQL runs as when the tests run as root)."""
    return Path(tempfile.mkdtemp(prefix="ibpool-test-stack-"))


@pytest.fixture(scope="session")
def stack() -> Iterator[devstack.StackInfo]:
    state = stack_dir()
    # Tests keep JetStream's production fsync setting; Postgres skips fsync to keep the suite fast.
    info = devstack.up(state, sync_always=True, pg_fsync=False)
    os.environ["IBPOOL_NATS_URL"] = info.nats_url
    os.environ["IBPOOL_POSTGRES_DSN"] = info.postgres_dsn
    try:
        yield info
    finally:
        devstack.down(state)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
async def bus(stack: devstack.StackInfo) -> AsyncIterator[Bus]:
    b = await Bus.connect(stack.nats_url, name="test")
    await b.ensure_streams()
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture
def schema() -> str:
    """A fresh Postgres schema name, so tests never see each other's rows."""
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store(stack: devstack.StackInfo, schema: str) -> AsyncIterator[Store]:
    async with own_store(stack, schema) as s:
        yield s


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)
