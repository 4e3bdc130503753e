"""Importers and exporters of the fabric topology (docs/fabric-formats.md). Pure: text in, values out.

Every importer takes the file's text (and the file name, for messages) and returns a `Topology`
whose `warnings` say what was odd; bad input raises `FormatError` ("FILE:LINE: reason"). Every
exporter takes a Topology (and optionally the hosts to keep) and returns `Exported(text, warnings)`.
`import_topology` / `export_topology` pick one by the names the CLI uses.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from pathlib import PurePath

from ..model import Topology
from .diagnostics import Exported, FormatError
from .hierarchy import Hierarchy, build_hierarchy, host_groups, leaf_groups
from .ibnetdiscover import export_ibnetdiscover, import_ibnetdiscover, parse_name_map
from .k8s import export_k8s_labels, import_k8s_labels
from .native import export_native, import_native, native_schema, native_schema_text
from .slurm import (
    export_slurm_block,
    export_slurm_tree,
    export_slurm_yaml,
    import_slurm,
    import_slurm_block,
    import_slurm_tree,
    import_slurm_yaml,
)
from .volcano import export_volcano, import_volcano

__all__ = [
    "EXPORT_FORMATS",
    "IMPORT_FORMATS",
    "Exported",
    "FormatError",
    "Hierarchy",
    "build_hierarchy",
    "export_ibnetdiscover",
    "export_k8s_labels",
    "export_native",
    "export_slurm_block",
    "export_slurm_tree",
    "export_slurm_yaml",
    "export_topology",
    "export_volcano",
    "guess_format",
    "host_groups",
    "import_ibnetdiscover",
    "import_k8s_labels",
    "import_native",
    "import_slurm",
    "import_slurm_block",
    "import_slurm_tree",
    "import_slurm_yaml",
    "import_topology",
    "import_volcano",
    "leaf_groups",
    "native_schema",
    "native_schema_text",
    "parse_name_map",
]

IMPORT_FORMATS = ("ibnetdiscover", "slurm", "slurm-block", "native", "k8s-labels", "volcano")
EXPORT_FORMATS = (
    "slurm",
    "slurm-block",
    "slurm-yaml",
    "k8s-labels",
    "k8s-labels-json",
    "volcano",
    "native",
    "native-yaml",
    "ibnetdiscover",
)


# `key: value` in YAML or JSON (one per line or compact), as a key of its own (after a line start,
# `-`, `{` or `,`): the value a word of its own
_KEY = r'(?:^|[{{,]|^\s*-)\s*"?{key}"?\s*:\s*"?{value}\b(?![-.\w])'


def guess_format(path: str, text: str) -> str:
    """The import format of `text` (read from `path`), from its content first, then its suffix:
    native (`format: ibpool.topology`), Volcano HyperNodes, Kubernetes Nodes, Slurm
    (`SwitchName=` / `BlockName=` lines or a topology.yaml), native for other .json/.yaml and for
    a bare topology object (`hosts` and `links` keys, as GET /v1/topology serves it), and
    ibnetdiscover otherwise."""
    if re.search(_KEY.format(key="format", value=r"ibpool\.topology"), text, re.M):
        return "native"
    if re.search(_KEY.format(key="kind", value="HyperNode"), text, re.M):
        return "volcano"
    if re.search(_KEY.format(key="kind", value="Node"), text, re.M):
        return "k8s-labels"
    if re.search(r"^\s*(SwitchName|BlockName)\s*=", text, re.M | re.I):
        return "slurm"
    if re.search(r"^-\s*topology\s*:", text, re.M):
        return "slurm"
    if PurePath(path).suffix.lower() in (".json", ".yaml", ".yml"):
        return "native"
    # a bare Topology, as the fabric monitor serves it (GET /v1/topology): top-level hosts and links
    if re.search(r'(?:^|[{,])\s*"?hosts"?\s*:', text, re.M) and re.search(r'(?:^|[{,])\s*"?links"?\s*:', text, re.M):
        return "native"
    return "ibnetdiscover"


def import_topology(
    kind: str,
    text: str,
    *,
    file: str,
    names: Mapping[str, str] | None = None,
    name: str = "fabric",
    rails: Sequence[str] | None = None,
) -> Topology:
    """Read `text` as `kind` (one of IMPORT_FORMATS). `slurm` takes a tree or block topology.conf or a
    topology.yaml; `slurm-block` insists on blocks. `names` (GUID -> name) and `rails` (adapter names
    in rail order) are for ibnetdiscover only."""
    if (names or rails) and kind != "ibnetdiscover":
        raise ValueError("a name map and a rail order apply to ibnetdiscover input only")
    if kind == "ibnetdiscover":
        return import_ibnetdiscover(text, file=file, names=names, name=name, rails=rails)
    if kind == "slurm":
        return import_slurm(text, file=file, name=name)
    if kind == "slurm-block":
        first = next((ln.split("#", 1)[0].strip() for ln in text.splitlines() if ln.split("#", 1)[0].strip()), "")
        if first.startswith(("-", "topology:", "---")):
            return import_slurm_yaml(text, file=file, name=name, kind="block")
        return import_slurm_block(text, file=file, name=name)
    if kind == "native":
        return import_native(text, file=file)
    if kind == "k8s-labels":
        return import_k8s_labels(text, file=file, name=name)
    if kind == "volcano":
        return import_volcano(text, file=file, name=name)
    raise ValueError(f"unknown input format {kind!r}; known: {', '.join(IMPORT_FORMATS)}")


def export_topology(kind: str, topology: Topology, *, nodes: Collection[str] | None = None) -> Exported:
    """Write `topology` as `kind` (one of EXPORT_FORMATS), only the hosts in `nodes` when given."""
    if kind == "slurm":
        return export_slurm_tree(topology, nodes=nodes)
    if kind == "slurm-block":
        return export_slurm_block(topology, nodes=nodes)
    if kind == "slurm-yaml":
        return export_slurm_yaml(topology, nodes=nodes)
    if kind == "k8s-labels":
        return export_k8s_labels(topology, nodes=nodes)
    if kind == "k8s-labels-json":
        return export_k8s_labels(topology, nodes=nodes, fmt="json")
    if kind == "volcano":
        return export_volcano(topology, nodes=nodes)
    if kind == "native":
        return export_native(topology, nodes=nodes)
    if kind == "native-yaml":
        return export_native(topology, nodes=nodes, fmt="yaml")
    if kind == "ibnetdiscover":
        return export_ibnetdiscover(topology, nodes=nodes)
    raise ValueError(f"unknown output format {kind!r}; known: {', '.join(EXPORT_FORMATS)}")
