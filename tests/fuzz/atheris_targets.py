"""Coverage-guided fuzz targets (atheris/libFuzzer) for the hand-written topology parsers
(ibnetdiscover, Slurm tree and block files, Slurm hostlists, Kubernetes labels).

Run by test_atheris.py in a child process, one target at a time and for a few seconds each:
    python tests/fuzz/atheris_targets.py TARGET [libFuzzer options] [CORPUS_DIR]
An exception other than FormatError is a crash: libFuzzer prints it and exits non-zero.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import atheris

with atheris.instrument_imports(include=["ibpool_core", "hostlist"]):  # the parsers, not msgspec or yaml
    from ibpool_core.fabric.formats import (
        FormatError,
        import_ibnetdiscover,
        import_k8s_labels,
        import_slurm,
    )
    from ibpool_core.fabric.formats.slurm import expand_hostlist

FILE = "fuzzed"


def _text_target(parse: Callable[[str], object]) -> Callable[[bytes], None]:
    def run(data: bytes) -> None:
        try:
            parse(data.decode("utf-8", "replace"))
        except FormatError:
            pass

    return run


TARGETS: dict[str, Callable[[bytes], None]] = {
    "ibnetdiscover": _text_target(lambda t: import_ibnetdiscover(t, file=FILE)),
    "slurm": _text_target(lambda t: import_slurm(t, file=FILE)),
    "hostlist": _text_target(lambda t: expand_hostlist(t, file=FILE, line=1)),
    "k8s-labels": _text_target(lambda t: import_k8s_labels(t, file=FILE)),
}


def main() -> None:
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
