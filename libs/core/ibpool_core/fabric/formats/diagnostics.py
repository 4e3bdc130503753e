"""Errors and warnings of the importers: each names the file and line it is about.

`FormatError` is what every importer raises on input it cannot turn into a topology; its message
is "FILE:LINE: reason" (or "FILE: reason" when no single line is to blame). It is a FabricError,
so a caller that catches FabricError catches both bad files and inconsistent models. Warnings are
plain strings in the same "FILE:LINE: message" form; importers put them in `Topology.warnings`.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import yaml

from ..model import FabricError


class FormatError(FabricError):
    """The input cannot be read: `file`, `line` (1-based, or None) and `reason` say why."""

    def __init__(self, file: str, line: int | None, reason: str) -> None:
        self.file = file
        self.line = line
        self.reason = reason
        super().__init__(where(file, line, reason))


def where(file: str, line: int | None, message: str) -> str:
    """ "FILE:LINE: message", the form of every warning and error."""
    return f"{file}:{line}: {message}" if line is not None else f"{file}: {message}"


def line_of_offset(text: str, offset: int, *, in_bytes: bool = False) -> int:
    """The 1-based line holding character `offset` of `text` (a UTF-8 byte offset if `in_bytes`)."""
    if in_bytes:
        data = text.encode()
        return data.count(b"\n", 0, max(0, offset)) + 1
    return text.count("\n", 0, max(0, offset)) + 1


def synthetic_guid(kind: str, name: str) -> str:
    """A stable GUID for a node whose source gives none (ibsim names, Slurm switches and nodes).

    Derived from a hash of kind and name, so the same file always gives the same GUIDs.
    """
    digest = hashlib.sha256(f"{kind}:{name}".encode()).digest()
    return f"0x{int.from_bytes(digest[:8], 'big'):016x}"


class Exported(NamedTuple):
    """What an exporter gives: the text, and warnings about what it could not express."""

    text: str
    warnings: list[str]


class LineDict(dict[Any, Any]):
    """A YAML mapping that remembers the line it starts on (`line`, 1-based)."""

    line: int | None = None


class _LineLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe loader (libyaml's when there is one) whose mappings know their line."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> LineDict:
    mapping = LineDict(loader.construct_mapping(node, deep=True))
    mapping.line = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def load_yaml(text: str, file: str, *, documents: bool = False) -> Any:
    """YAML (safe subset) with line numbers on mappings; syntax errors become `FormatError`.

    With `documents`, a list of every document in a multi-document stream (empty ones dropped).
    """
    try:
        if documents:
            return [d for d in yaml.load_all(text, Loader=_LineLoader) if d is not None]  # a safe loader
        return yaml.load(text, Loader=_LineLoader)  # a safe loader
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark is not None else None
        raise FormatError(file, line, f"not valid YAML: {error.problem or error}") from None
    except yaml.YAMLError as error:
        raise FormatError(file, None, f"not valid YAML: {error}") from None


def dump_yaml(documents: list[Any], *, stream: bool = False) -> str:
    """Safe YAML (libyaml's emitter when there is one), keys in insertion order; a `---` stream if `stream`."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    if stream:
        return str(yaml.dump_all(documents, Dumper=dumper, sort_keys=False, explicit_start=True))
    return str(yaml.dump(documents, Dumper=dumper, sort_keys=False))


def line_of(value: object) -> int | None:
    return value.line if isinstance(value, LineDict) else None
