"""A throw-away Slurm for tests (`ibpool_runtime.slurmstack`): skipped where Debian's munge,
slurmctld and slurmd are not installed, a failure when IBPOOL_REQUIRE_SLURM=1 (`.ci/run` installs
them and sets it)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibpool_runtime import slurmstack


def require_slurm() -> None:
    """Skip (or fail under IBPOOL_REQUIRE_SLURM=1) where a throw-away Slurm cannot run."""
    why = slurmstack.unavailable()
    if why:
        if os.environ.get("IBPOOL_REQUIRE_SLURM") == "1":
            pytest.fail(f"{why}, and IBPOOL_REQUIRE_SLURM=1")
        pytest.skip(why)


@pytest.fixture(scope="module")
def munge_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    require_slurm()
    with slurmstack.munge(tmp_path_factory.mktemp("munge")) as socket_path:
        yield socket_path


# slurmctld's log lines that say nothing about the configuration under test: a fresh state
# directory, no PMIx library, no mail program.
_NOISE = re.compile(
    r"state file|Trying backup|No .* state file|pmix|MPI: Cannot create context|mpi/pmix|MailProg|"
    r"memory enforcing|backup_controller"
)


def log_complaints(log: str) -> list[str]:
    """The error, warning and fatal lines of a slurmctld log, less the noise of a throw-away cluster."""
    return [
        line
        for line in log.splitlines()
        if re.search(r"\b(error|fatal|warning)\b", line, re.I) and not _NOISE.search(line)
    ]
