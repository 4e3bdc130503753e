"""A bounded coverage-guided run (atheris) of each target in atheris_targets.py, seeded with files
our exporters write: it must end without a crash (an exception other than FormatError) or a hang.
IBPOOL_ATHERIS_SECONDS (default 2) is each target's time."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ibpool_core.fabric.formats import export_topology
from ibpool_core.fabric.generators import generate
from tests.fuzz.atheris_targets import TARGETS
from tests.fuzz.budget import DERANDOMIZE

SECONDS = int(os.environ.get("IBPOOL_ATHERIS_SECONDS", "2"))
SCRIPT = Path(__file__).with_name("atheris_targets.py")
SEEDS = {
    "ibnetdiscover": ["ibnetdiscover"],
    "slurm": ["slurm", "slurm-block"],
    "hostlist": [],
    "k8s-labels": ["k8s-labels"],
}


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_bounded_coverage_guided_run(target: str, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    fabric = generate("fat_tree_2tier:hosts=4,radix=4")
    for kind in SEEDS[target]:
        (corpus / kind).write_text(export_topology(kind, fabric).text)
    (corpus / "hostlist").write_text("gpu[001-004,010],cn-[1-3]x")
    (corpus / "names").write_text('0x0000000000000001 leaf-1\n# comment\n0x2 "spine 1"\n')
    child = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            target,
            f"-max_total_time={SECONDS}",
            *(["-seed=1"] if DERANDOMIZE else []),  # CI: the same inputs in the same order every run
            "-timeout=10",
            "-rss_limit_mb=1024",
            str(corpus),
        ],
        capture_output=True,
        text=True,
        timeout=SECONDS + 60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    log = child.stderr[-4000:]
    assert child.returncode == 0, f"atheris found a crash in {target}:\n{log}"
    done = re.search(r"Done (\d+) runs", child.stderr)
    assert done and int(done.group(1)) > 0, log
