"""The launcher's work directories: one per workload key under `work_dir`, never outside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibpool_node_agent.launcher import LaunchError, ProcessLauncher


@pytest.mark.parametrize("key", ["", ".", "..", "../etc", "a/b", "a\\b", "x\0y"])
def test_a_key_that_would_leave_the_work_dir_is_refused(tmp_path: Path, key: str) -> None:
    launcher = ProcessLauncher(tmp_path / "work")
    with pytest.raises(LaunchError, match="cannot name a directory"):
        launcher.dir_of(key)
    assert launcher.remove_dirs([key]) == 0
    assert (tmp_path / "work").exists() is False


async def test_a_refused_key_starts_nothing(tmp_path: Path) -> None:
    launcher = ProcessLauncher(tmp_path / "work")
    with pytest.raises(LaunchError):
        await launcher.start("../escape", ["true"], {})
    assert not (tmp_path / "escape").exists() and launcher.running == {}


def test_removing_dirs_deletes_only_the_named_ones(tmp_path: Path) -> None:
    launcher = ProcessLauncher(tmp_path)
    for key in ("a-1@n1", "a-2@n1"):
        (tmp_path / key).mkdir()
        (tmp_path / key / "output.log").write_text("out\n")
    assert launcher.remove_dirs(["a-1@n1", "gone@n1"]) == 1
    assert not (tmp_path / "a-1@n1").exists() and (tmp_path / "a-2@n1" / "output.log").exists()
