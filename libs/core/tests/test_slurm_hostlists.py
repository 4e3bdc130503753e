"""Hostlists as Slurm itself reads them: every expression `compress_hostlist` writes is expanded by
the real `scontrol show hostnames` (Debian's slurm-client, with a throw-away slurm.conf) back to
exactly the names it was given. `.ci/run` installs slurm-client and sets IBPOOL_REQUIRE_SLURM=1:
without scontrol these tests fail there and are skipped elsewhere."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibpool_core.fabric.formats.slurm import compress_hostlist

CASES = [
    # what Slurm 22.05 refused before (issue 21): text after a bracket range, hex-like names
    ["H-e09d73030085811c", "H-e09d73030085856c", "node01-ib", "node02-ib", "n1.lan", "n2.lan"],
    ["node01", "node02", "node03", "node05", "node10", "n9", "n10", "x", "gpu001", "gpu100"],
    ["r1n1", "r1n2", "r2n1"],
    ["dgx-a100-001", "dgx-a100-002", "dgx-a100-010"],
    ["a", "b", "c0", "c00", "c000"],
]


def scontrol() -> str | None:
    found = shutil.which("scontrol")
    if found is None:
        if os.environ.get("IBPOOL_REQUIRE_SLURM") == "1":
            pytest.fail("scontrol (slurm-client) is not installed, and IBPOOL_REQUIRE_SLURM=1")
        pytest.skip("scontrol (slurm-client) is not installed")
    return found


def slurm_expands(expression: str, conf: Path) -> list[str]:
    """`scontrol show hostnames EXPRESSION`: Slurm's own expansion (its error when it refuses)."""
    r = subprocess.run(
        [str(scontrol()), "show", "hostnames", expression],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": str(conf)},
        timeout=30,
    )
    # scontrol exits 0 on a hostlist it cannot parse: it says so on stderr and prints nothing
    assert r.returncode == 0 and "Invalid hostlist" not in r.stderr, f"scontrol refused {expression!r}: {r.stderr}"
    return r.stdout.split()


@pytest.fixture(scope="module")
def conf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    path.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=dummy\nPartitionName=p Nodes=dummy\n")
    return path


@pytest.mark.parametrize("names", CASES)
def test_slurm_reads_back_exactly_the_names(names: list[str], conf: Path) -> None:
    expression = compress_hostlist(names)
    assert sorted(slurm_expands(expression, conf)) == sorted(names), expression


def test_python_hostlist_forms_that_slurm_refuses_are_not_written(conf: Path) -> None:
    refused = subprocess.run(
        [str(scontrol()), "show", "hostnames", "node[01-02]-ib"],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": str(conf)},
        timeout=30,
    )
    assert "Invalid hostlist" in refused.stderr and not refused.stdout.strip()  # the old compressor's form
    assert "]-" not in compress_hostlist(["node01-ib", "node02-ib"])


NAMES = st.builds(
    lambda prefix, number, width, suffix: f"{prefix}{number:0{width}d}{suffix}" if number is not None else prefix,
    st.sampled_from(["gpu", "node", "n", "dgx-a", "r1n", "x.y-"]),
    st.none() | st.integers(0, 1200),
    st.integers(0, 4),
    st.sampled_from(["", "", "", "-ib", ".lan", "b"]),
)


@settings(max_examples=60, deadline=None, derandomize=os.environ.get("CI") == "true")
@given(names=st.lists(NAMES, min_size=1, max_size=40, unique=True))
def test_any_set_of_names_round_trips_through_slurm(names: list[str], tmp_path_factory: pytest.TempPathFactory) -> None:
    conf = tmp_path_factory.getbasetemp() / "slurm-prop.conf"
    if not conf.exists():
        conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=dummy\nPartitionName=p Nodes=dummy\n")
    expression = compress_hostlist(names)
    assert sorted(slurm_expands(expression, conf)) == sorted(names), expression
