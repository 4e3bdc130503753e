"""Topology files, Slurm's among them: every importer of ibpool_core.fabric.formats, on arbitrary
text and on near-misses of files our exporters write (lines dropped, duplicated, swapped, a token
replaced; bytes garbled), raises only `FormatError` ("FILE:LINE: reason")."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ibpool_core.fabric.formats import (
    FormatError,
    export_topology,
    import_ibnetdiscover,
    import_k8s_labels,
    import_native,
    import_slurm,
    import_slurm_block,
    import_slurm_tree,
    import_slurm_yaml,
    import_volcano,
    parse_name_map,
)
from ibpool_core.fabric.formats.slurm import expand_hostlist
from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.model import Topology
from tests.fuzz.budget import FUZZ, TRICKY_TOKENS, mutated, mutated_lines

FILE = "fuzzed.txt"
IMPORTERS: dict[str, Callable[[str], object]] = {
    "ibnetdiscover": lambda text: import_ibnetdiscover(text, file=FILE),
    "slurm": lambda text: import_slurm(text, file=FILE),
    "slurm-tree": lambda text: import_slurm_tree(text, file=FILE),
    "slurm-tree-lenient": lambda text: import_slurm_tree(text, file=FILE, strict=False),
    "slurm-block": lambda text: import_slurm_block(text, file=FILE),
    "slurm-yaml": lambda text: import_slurm_yaml(text, file=FILE),
    "native": lambda text: import_native(text, file=FILE),
    "k8s-labels": lambda text: import_k8s_labels(text, file=FILE),
    "volcano": lambda text: import_volcano(text, file=FILE),
    "volcano-lenient": lambda text: import_volcano(text, file=FILE, strict=False),
    "name-map": lambda text: parse_name_map(text, file=FILE),
}
# Which importer reads what each exporter writes.
READS = {
    "ibnetdiscover": "ibnetdiscover",
    "slurm": "slurm",
    "slurm-block": "slurm-block",
    "slurm-yaml": "slurm-yaml",
    "native": "native",
    "native-yaml": "native",
    "k8s-labels": "k8s-labels",
    "k8s-labels-json": "k8s-labels",
    "volcano": "volcano",
}
FABRICS = [generate("fat_tree_2tier:hosts=4,radix=4"), generate("rail_optimised:hosts=2,rails=2,radix=4,su_size=2")]
SAMPLES = {(kind, i): export_topology(kind, t).text for kind in READS for i, t in enumerate(FABRICS)}

# Text that looks a little like the formats: their keywords and punctuation among random characters.
format_ish = st.lists(
    st.sampled_from(
        [
            "SwitchName=s1 ",
            "Switches=s[1-2] ",
            "Nodes=gpu[01-04]",
            "BlockName=b1 ",
            "BlockSizes=4",
            "Switch 36 ",
            'Ca 1 "H-0x0000000000000001" ',
            "[1](0x1) ",
            '"S-0x000000000000000a"[1] ',
            "# lid 1 lmc 0 ",
            "- topology: t\n",
            "  cluster_default: true\n",
            "tree:\n",
            "{",
            "}",
            '"hosts": [',
            "]",
            "apiVersion: topology.volcano.sh/v1alpha1\n",
            "kind: HyperNode\n",
            "members:\n",
            "  - type: Node\n",
            "ibpool.io/leaf=",
            "\n",
            " ",
            "0x",
            "gpu",
            *TRICKY_TOKENS,
        ]
    )
    | st.text(max_size=6),
    max_size=40,
).map("".join)


def reads_or_rejects(importer: str, text: str) -> None:
    try:
        result = IMPORTERS[importer](text)
    except FormatError as e:
        assert str(e).startswith(FILE), f"the error names the file: {e}"
        return
    assert isinstance(result, Topology | dict)


@pytest.mark.parametrize("importer", sorted(IMPORTERS))
@FUZZ
@given(text=st.text(max_size=300) | format_ish)
def test_arbitrary_text(importer: str, text: str) -> None:
    reads_or_rejects(importer, text)


@pytest.mark.parametrize("sample", sorted(SAMPLES), ids=lambda s: f"{s[0]}-{s[1]}")
@FUZZ
@given(data=st.data())
def test_near_misses_of_exported_files(sample: tuple[str, int], data: st.DataObject) -> None:
    text = SAMPLES[sample]
    importer = READS[sample[0]]
    reads_or_rejects(importer, data.draw(mutated_lines(text)))
    garbled = data.draw(mutated(text.encode())).decode(errors="replace")
    reads_or_rejects(importer, garbled)


@FUZZ
@given(st.text(alphabet="gpu0123456789[]-,:^x ", max_size=30) | st.text(max_size=20))
def test_slurm_hostlists(expression: str) -> None:
    try:
        names = expand_hostlist(expression, file=FILE, line=3)
    except FormatError as e:
        assert str(e).startswith(f"{FILE}:3:")
        return
    assert all(isinstance(n, str) for n in names)


@pytest.mark.parametrize(
    "text",
    [
        "BlockName=b1 Nodes=n[1-2]\nBlockSizes=0,4\n",  # found by the atheris run: ZeroDivisionError
        "BlockName=b1 Nodes=n[1-2]\nBlockSizes=-2\n",
        "- topology: t\n  cluster_default: true\n  block:\n    blocks:\n      - block: b1\n        nodes: [n1]\n"
        "    block_sizes: [0]\n",
    ],
)
def test_block_sizes_below_one_are_a_format_error(text: str) -> None:
    importer = import_slurm_yaml if text.startswith("-") else import_slurm
    with pytest.raises(FormatError, match="at least 1"):
        importer(text, file=FILE)


def test_a_hostlist_that_recurses_too_deep_is_a_format_error() -> None:
    """Found by the atheris run: python-hostlist recursed into RecursionError on this expression."""
    with pytest.raises(FormatError, match="nested too deeply"):
        expand_hostlist("[]-=[]%[\xa8#\n\n]", file=FILE, line=3)
