"""The native format: the model itself, as msgspec JSON or YAML, with a published JSON Schema.

A document is `{"format": "ibpool.topology", "version": 1, "topology": {...}}` where `topology`
is `model.Topology` (hosts, CAs with their rails, switches with tier-independent facts, routers,
links with both ends, width, speed, state, media; warnings). Nothing is lost: this is the export
that keeps per-rail detail. A bare Topology object is read too. `native_schema()` is the JSON
Schema of the document, generated from the Structs (docs/fabric-topology.schema.json).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import Any, Literal

import msgspec

from ..model import FabricError, Topology, build_topology
from .diagnostics import Exported, FormatError, line_of_offset, load_yaml
from .hierarchy import subset_topology

__all__ = ["FORMAT", "VERSION", "NativeDocument", "export_native", "import_native", "native_schema"]

FORMAT = "ibpool.topology"
VERSION = 1


class NativeDocument(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An ibpool topology file."""

    format: Literal["ibpool.topology"] = "ibpool.topology"
    version: int = VERSION
    topology: Topology


def native_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of a native document, generated from the Structs."""
    schema: dict[str, Any] = msgspec.json.schema(NativeDocument)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ibpool topology"
    return schema


def native_schema_text() -> str:
    """`native_schema()` as the text of the published file."""
    return json.dumps(native_schema(), indent=2, sort_keys=True) + "\n"


def export_native(
    topology: Topology, *, nodes: Collection[str] | None = None, fmt: Literal["json", "yaml"] = "json"
) -> Exported:
    """The native document (`fmt` json or yaml). With `nodes`, only those hosts (and every switch)."""
    warnings: list[str] = []
    if nodes is not None:
        topology, warnings = subset_topology(topology, nodes)
    document = NativeDocument(topology=topology)
    if fmt == "yaml":
        return Exported(msgspec.yaml.encode(document).decode(), warnings)
    return Exported(msgspec.json.format(msgspec.json.encode(document), indent=2).decode() + "\n", warnings)


_BYTE = re.compile(r"\(byte (\d+)\)")


def import_native(text: str, *, file: str = "<native>") -> Topology:
    """A native document (JSON or YAML; a bare Topology object too), checked like any other import."""
    if not text.strip():
        raise FormatError(file, 1, "empty file: no topology")
    data: Any
    if text.lstrip().startswith(("{", "[")):
        try:
            data = msgspec.json.decode(text)
        except msgspec.DecodeError as error:
            offset = _BYTE.search(str(error))
            line = line_of_offset(text, int(offset[1]), in_bytes=True) if offset else None
            raise FormatError(file, line, f"not valid JSON: {error}") from None
    else:
        data = load_yaml(text, file)
    if not isinstance(data, dict):
        raise FormatError(file, 1, "expected an object with a 'topology' (an ibpool native topology document)")
    try:
        if "topology" in data:
            if data.get("format", FORMAT) != FORMAT:
                raise FormatError(file, None, f"format is {data.get('format')!r}, not {FORMAT!r}")
            if data.get("version", VERSION) != VERSION:
                raise FormatError(
                    file, None, f"version {data.get('version')!r} is not supported (this reads {VERSION})"
                )
            topology = msgspec.convert(data, NativeDocument).topology
        else:
            topology = msgspec.convert(data, Topology)
    except msgspec.ValidationError as error:
        raise FormatError(file, None, f"not an ibpool topology: {error}") from None
    try:
        return build_topology(
            name=topology.name,
            hosts=topology.hosts,
            cas=topology.cas,
            switches=topology.switches,
            routers=topology.routers,
            links=topology.links,
            warnings=topology.warnings,
        )
    except FabricError as error:
        raise FormatError(file, None, str(error)) from None
