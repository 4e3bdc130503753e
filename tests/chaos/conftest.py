"""The chaos suite's fixtures: a docker daemon, current images, one system per scenario, the report.

`make test` runs the scenarios marked `chaos_smoke`; `make chaos` runs them all and writes the
report table to docs/reliability.md. Without a docker daemon the scenarios are skipped, unless
IBPOOL_REQUIRE_DOCKER=1 (which `.ci/run` sets once it has started one): then they fail.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from .report import write_report
from .scenario import Outcome, ensure_streams
from .system import IMAGES, Layout, System, new_system

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # no image can be pulled: no reaper
OUTCOMES: list[Outcome] = []


@pytest.fixture(scope="session")
def images() -> None:
    """A docker daemon and images built from this tree (deploy/docker/images.sh: cached, seconds when unchanged)."""
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        why = "no docker daemon (start dockerd: deploy/README.md)"
        if os.environ.get("IBPOOL_REQUIRE_DOCKER") == "1":
            pytest.fail(f"{why}, and IBPOOL_REQUIRE_DOCKER=1")
        pytest.skip(why)
    r = subprocess.run([str(ROOT / "deploy/docker/images.sh"), *IMAGES], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"deploy/docker/images.sh failed ({r.returncode}):\n{r.stderr[-4000:]}")


@pytest.fixture
async def system(images: None, request: pytest.FixtureRequest) -> AsyncIterator[System]:
    """The system in containers; indirect parametrisation passes its `Layout`. The admin creates
    the R3 streams once the NATS cluster is up, before any service starts (as compose's job does)."""
    layout = getattr(request, "param", Layout())
    sys_ = await asyncio.to_thread(new_system, layout)
    try:
        await asyncio.to_thread(sys_.start_infrastructure)
        await ensure_streams(sys_)
        await asyncio.to_thread(sys_.start_services)
        yield sys_
    finally:
        await asyncio.to_thread(sys_.stop)


@pytest.fixture
def outcomes() -> Iterator[list[Outcome]]:
    """A scenario appends its outcome here; the session's report collects them."""
    mine: list[Outcome] = []
    yield mine
    OUTCOMES.extend(mine)


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("IBPOOL_CHAOS_REPORT")
    if OUTCOMES:
        write_report(OUTCOMES, Path(target) if target else ROOT / ".ibpool" / "reliability.md")
