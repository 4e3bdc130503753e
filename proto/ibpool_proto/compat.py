"""The version rule, as pure functions: compare the message classes with the last released contract.

A released snapshot maps every ce-type to its subject key and its fields; each field has its type
(as a self-contained JSON Schema, nested Structs inlined) and whether it is required:

    {"io.ibpool.pool.allocation.granted.v1": {
        "key_name": "node_id",
        "fields": {"allocation_id": {"required": true, "schema": {"type": "string"}}, ...}}}

Compatible (same ce-type): adding an optional field (one with a default), at any depth, and giving
an existing field a default (every field is always encoded, so readers still find it).
Violations (need a new `.v<N+1>` type next to the old one): removing a field, changing its type
(including nested Structs, enum values, nullability), adding a required field, making an optional
field required, changing the subject key, and removing a released ce-type.

    python -m ibpool_proto.compat                     check against the newest released snapshot
    python -m ibpool_proto.compat --write-snapshot    rewrite the newest snapshot from the code
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import msgspec

from .codec import ALL_MESSAGES
from .message import Message

RELEASED_DIR = Path(__file__).parent / "released"
TAG_FIELD = "type"
# Keywords that document a schema without constraining the JSON it accepts.
_ANNOTATIONS = frozenset({"default", "title", "description", "examples"})


class FieldSpec(TypedDict):
    schema: dict[str, Any]
    required: bool


class MessageSpec(TypedDict):
    key_name: str
    fields: dict[str, FieldSpec]


Snapshot = dict[str, MessageSpec]


def message_spec(cls: type[Message]) -> MessageSpec:
    """The released form of one message class: its subject key and every field but the type tag."""
    refs, components = msgspec.json.schema_components([cls], ref_template="{name}")
    body = components[refs[0]["$ref"]]
    required = set(body.get("required", ()))
    fields: dict[str, FieldSpec] = {
        name: {"schema": _normalize(prop, components, ()), "required": name in required}
        for name, prop in body["properties"].items()
        if name != TAG_FIELD
    }
    return {"key_name": cls.key_name, "fields": fields}


def snapshot(messages: Iterable[type[Message]] = ALL_MESSAGES) -> Snapshot:
    return {cls.ce_type(): message_spec(cls) for cls in sorted(messages, key=lambda m: m.ce_type())}


def violations(released: Mapping[str, MessageSpec], messages: Iterable[type[Message]]) -> list[str]:
    """Every way the message classes break the released contract; empty when they keep it."""
    current = snapshot(messages)
    found: list[str] = []
    for ce_type, old in sorted(released.items()):
        new = current.get(ce_type)
        if new is None:
            found.append(f"{ce_type}: released type was removed (keep it while its successor ships)")
            continue
        if old["key_name"] != new["key_name"]:
            found.append(f"{ce_type}: subject key changed from {old['key_name']!r} to {new['key_name']!r}")
        found.extend(f"{ce_type}: {v}" for v in _object_violations(old["fields"], new["fields"], ""))
    return found


def load_snapshot(path: Path) -> Snapshot:
    data: Snapshot = json.loads(path.read_text(encoding="utf-8"))
    return data


def latest_snapshot_path(directory: Path = RELEASED_DIR) -> Path:
    """The newest `v<N>.json` in `directory` (by N); `v1.json` when there is none yet."""
    numbered = [(int(p.stem[1:]), p) for p in directory.glob("v*.json") if p.stem[1:].isdigit()]
    return max(numbered)[1] if numbered else directory / "v1.json"


def dump_snapshot(snap: Snapshot) -> str:
    return json.dumps(snap, indent=2, sort_keys=True) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ibpool_proto.compat",
        description="Check the message classes against the released contract snapshot.",
    )
    parser.add_argument("--snapshot", type=Path, default=None, help="default: the newest released snapshot")
    parser.add_argument("--write-snapshot", action="store_true", help="write the snapshot from the code")
    args = parser.parse_args(argv)
    path: Path = args.snapshot or latest_snapshot_path()
    if args.write_snapshot:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump_snapshot(snapshot()), encoding="utf-8")
        print(f"wrote {path}")
        return 0
    found = violations(load_snapshot(path), ALL_MESSAGES)
    for v in found:
        print(v)
    print(f"{len(found)} violation(s) against {path.name}")
    return 1 if found else 0


def _object_violations(old: Mapping[str, FieldSpec], new: Mapping[str, FieldSpec], prefix: str) -> list[str]:
    found: list[str] = []
    for name, old_field in old.items():
        path = f"{prefix}{name}"
        new_field = new.get(name)
        if new_field is None:
            found.append(f"field {path!r} was removed")
            continue
        if new_field["required"] and not old_field["required"]:
            found.append(f"field {path!r} became required")
        found.extend(_schema_violations(old_field["schema"], new_field["schema"], path))
    for name, new_field in new.items():
        if name not in old and new_field["required"]:
            found.append(f"required field {prefix}{name!r} was added (give it a default)")
    return found


def _schema_violations(old: Any, new: Any, path: str) -> list[str]:
    if _is_object(old) and _is_object(new):
        rest_old = {k: v for k, v in old.items() if k not in ("properties", "required")}
        rest_new = {k: v for k, v in new.items() if k not in ("properties", "required")}
        found = _object_violations(_fields_of(old), _fields_of(new), f"{path}.")
        return found + _schema_violations(rest_old, rest_new, path)
    if isinstance(old, dict) and isinstance(new, dict) and old.keys() == new.keys():
        found = []
        for k in sorted(old):
            found.extend(_schema_violations(old[k], new[k], _sub_path(path, k)))
        return found
    if (
        isinstance(old, list)
        and isinstance(new, list)
        and len(old) == len(new)
        and all(isinstance(x, dict) for x in old + new)
    ):
        return [v for o, n in zip(old, new, strict=True) for v in _schema_violations(o, n, path)]
    if old != new:
        return [f"field {path!r} changed type from {_short(old)} to {_short(new)}"]
    return []


def _normalize(schema: Any, components: Mapping[str, Any], seen: tuple[str, ...]) -> Any:
    """Inline every $ref and drop annotations, so a field's schema stands alone and compares by value."""
    if isinstance(schema, list):
        return [_normalize(s, components, seen) for s in schema]
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str):
        if ref in seen:  # a recursive Struct: compare it by name
            return {"$ref": ref}
        return _normalize(components[ref], components, (*seen, ref))
    return {
        k: (v if k in ("required", "enum", "const") else _normalize(v, components, seen))
        for k, v in schema.items()
        if k not in _ANNOTATIONS
    }


def _is_object(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "object" and "properties" in schema


def _fields_of(schema: Mapping[str, Any]) -> dict[str, FieldSpec]:
    required = set(schema.get("required", ()))
    return {name: {"schema": prop, "required": name in required} for name, prop in schema["properties"].items()}


def _sub_path(path: str, keyword: str) -> str:
    return {"items": f"{path}[]", "additionalProperties": f"{path}{{}}"}.get(keyword, path)


def _short(schema: Any) -> str:
    text = json.dumps(schema, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."


if __name__ == "__main__":
    sys.exit(main())
