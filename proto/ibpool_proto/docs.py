"""Generate the published event docs from the message classes: JSON Schemas, AsyncAPI 3, an index.

    python -m ibpool_proto.docs docs/events        (what `make docs` runs)

Writes, deterministically (sorted keys, stable order, no timestamps):

- `schemas/<ce-type>.json`: one JSON Schema (draft 2020-12) per message;
- `asyncapi.json`: an AsyncAPI 3.0.0 document of every subject, message and operation;
- `index.md`: a table of every message.

Hand-written files in the same folder (README.md, subscribing.md) are left alone; schema files of
messages that no longer exist are removed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from .codec import ALL_MESSAGES
from .message import Command, Message

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
ASYNCAPI_VERSION = "3.0.0"
NATS_BINDING_VERSION = "0.1.0"
CONTENT_TYPE = "application/json"
SCHEMAS_DIR = "schemas"
ASYNCAPI_FILE = "asyncapi.json"
INDEX_FILE = "index.md"
SERVER_URL = "nats://localhost:4222"
TRACEPARENT_PATTERN = "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"

Json = dict[str, Any]


def kind_of(cls: type[Message]) -> str:
    return "command" if issubclass(cls, Command) else "event"


def stream_of(cls: type[Message]) -> str:
    """The JetStream stream that stores this message: one stream per domain (IBPOOL_<DOMAIN>);
    "none" for a message sent on core NATS only (`Message.stored`)."""
    return f"IBPOOL_{cls.type_name().domain.upper()}" if cls.stored else "none"


def channel_address(cls: type[Message]) -> str:
    return f"{cls.subject_root()}.{{{cls.key_name}}}"


def channel_id(cls: type[Message]) -> str:
    """One channel per subject root; every version of a message shares it (`pool.allocation.granted`)."""
    t = cls.type_name()
    return f"{t.domain}.{t.entity}.{t.verb}"


def schema_file_name(cls: type[Message]) -> str:
    return f"{cls.ce_type()}.json"


def ordered_messages(messages: Sequence[type[Message]] = ALL_MESSAGES) -> list[type[Message]]:
    return sorted(messages, key=lambda m: m.ce_type())


def message_schema(cls: type[Message]) -> Json:
    """A standalone JSON Schema for one message: the Struct at the top level, nested Structs in $defs."""
    generated = msgspec.json.schema(cls)
    defs: Json = dict(generated.get("$defs", {}))
    name = generated["$ref"].rsplit("/", 1)[-1]
    body: Json = defs.pop(name)
    schema: Json = {
        "$schema": JSON_SCHEMA_DIALECT,
        **body,
        "title": cls.__name__,
        "description": cls.summary,
        "x-ce-type": cls.ce_type(),
        "x-kind": kind_of(cls),
        "x-subject": channel_address(cls),
        "x-stream": stream_of(cls),
    }
    if defs:
        schema["$defs"] = defs
    return schema


def headers_schema(cls: type[Message]) -> Json:
    """The NATS headers every message carries: CloudEvents binary mode, dedup id, trace context."""
    return {
        "type": "object",
        "properties": {
            "ce-specversion": {"const": "1.0", "description": "CloudEvents spec version."},
            "ce-id": {
                "type": "string",
                "description": "The message id (UUIDv7), equal to the payload's `id`; dedup on it.",
            },
            "ce-source": {"type": "string", "description": "The emitting service instance."},
            "ce-type": {"const": cls.ce_type(), "description": "The CloudEvents type: message and version."},
            "ce-time": {"type": "string", "format": "date-time", "description": "When it happened (UTC)."},
            "ce-subject": {"type": "string", "description": f"The subject key: the {cls.key_name}."},
            "content-type": {"const": CONTENT_TYPE},
            "Nats-Msg-Id": {
                "type": "string",
                "description": "Equal to ce-id; JetStream drops a second publish inside the stream's duplicate window.",
            },
            "traceparent": {
                "type": "string",
                "pattern": TRACEPARENT_PATTERN,
                "description": "W3C trace context of the publishing span, when tracing is on.",
            },
        },
        "required": [
            "ce-specversion",
            "ce-id",
            "ce-source",
            "ce-type",
            "ce-time",
            "ce-subject",
            "content-type",
            "Nats-Msg-Id",
        ],
    }


def asyncapi_document(messages: Sequence[type[Message]] = ALL_MESSAGES) -> Json:
    ordered = ordered_messages(messages)
    refs, components = msgspec.json.schema_components(ordered, ref_template="#/components/schemas/{name}")
    # msgspec returns one {"$ref": ...} per type, in order; the class name unless two classes clash.
    payload_ref = {cls: ref["$ref"] for cls, ref in zip(ordered, refs, strict=True)}

    channels: Json = {}
    operations: Json = {}
    component_messages: Json = {}
    # A channel is addressed by the key of its newest version (a v2 may change the subject key).
    newest: dict[str, type[Message]] = {}
    for cls in ordered:
        cid = channel_id(cls)
        if cid not in newest or cls.type_name().version > newest[cid].type_name().version:
            newest[cid] = cls
    for cls in ordered:
        ce_type = cls.ce_type()
        cid = channel_id(cls)
        head = newest[cid]
        older = sorted(
            f"v{m.type_name().version}: the {m.key_name}"
            for m in ordered
            if channel_id(m) == cid and m.key_name != head.key_name
        )
        channel = channels.setdefault(
            cid,
            {
                "address": channel_address(head),
                "title": cid,
                "description": (
                    f"Stored in JetStream stream `{stream_of(head)}`. "
                    if head.stored
                    else "Core NATS only, not stored: subscribe to the subject. "
                )
                + f"The last subject token is the {head.key_name}"
                + (f" ({'; '.join(older)})." if older else "."),
                "messages": {},
                "parameters": {
                    head.key_name: {"description": f"The {head.key_name} this message is about."},
                },
                "bindings": {"nats": {"bindingVersion": NATS_BINDING_VERSION}},
            },
        )
        channel["messages"][ce_type] = {"$ref": f"#/components/messages/{ce_type}"}
        component_messages[ce_type] = {
            "name": cls.__name__,
            "title": f"{cls.__name__} (v{cls.type_name().version})",
            "summary": cls.summary,
            "contentType": CONTENT_TYPE,
            "headers": headers_schema(cls),
            "payload": {"$ref": payload_ref[cls]},
            "x-ce-type": ce_type,
            "x-kind": kind_of(cls),
        }
        # ibpool sends its events; it receives commands (from schedulers, the CLI, other systems).
        action = "receive" if kind_of(cls) == "command" else "send"
        op = operations.setdefault(
            f"{cid}.{action}",
            {
                "action": action,
                "channel": {"$ref": f"#/channels/{cid}"},
                "title": f"{action} {cid}",
                "summary": cls.summary,
                "messages": [],
                "bindings": {"nats": {"bindingVersion": NATS_BINDING_VERSION}},
            },
        )
        op["messages"].append({"$ref": f"#/channels/{cid}/messages/{ce_type}"})

    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "ibpool events",
            "version": _contract_version(),
            "description": (
                "Every event and command on the ibpool bus (NATS JetStream). Messages are JSON in "
                "CloudEvents binary mode: the envelope rides in NATS headers (`ce-id`, `ce-source`, "
                "`ce-type`, `ce-time`), the payload is the message itself. Subjects are "
                "`ibpool.<domain>.<entity>.<verb>.<key>`; each domain has its own stream `IBPOOL_<DOMAIN>`. "
                "Generated from ibpool_proto; see docs/events/README.md for the version rule."
            ),
        },
        "defaultContentType": CONTENT_TYPE,
        "servers": {
            "local": {
                "host": SERVER_URL.removeprefix("nats://"),
                "protocol": "nats",
                "description": f"The embedded dev stack ({SERVER_URL}); production uses a 3-node cluster.",
            },
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": component_messages, "schemas": components},
    }


def index_markdown(messages: Sequence[type[Message]] = ALL_MESSAGES) -> str:
    rows = sorted(messages, key=lambda m: (m.type_name().domain, m.ce_type()))
    lines = [
        "# ibpool events and commands",
        "",
        "Generated by `make docs` from `proto/ibpool_proto`; do not edit. "
        "See [README.md](README.md) for the version rule and [subscribing.md](subscribing.md) "
        "for how to consume them.",
        "",
        "| ce-type | kind | domain | stream | subject | key | summary |",
        "|---|---|---|---|---|---|---|",
    ]
    for cls in rows:
        t = cls.type_name()
        summary = cls.summary.replace("|", "\\|")
        lines.append(
            f"| [`{cls.ce_type()}`]({SCHEMAS_DIR}/{schema_file_name(cls)}) | {kind_of(cls)} | {t.domain} "
            f"| {stream_of(cls)} | `{channel_address(cls)}` | {cls.key_name} | {summary} |"
        )
    return "\n".join(lines) + "\n"


def render(messages: Sequence[type[Message]] = ALL_MESSAGES) -> dict[str, str]:
    """Every generated file: relative path (with '/') -> its text."""
    files = {f"{SCHEMAS_DIR}/{schema_file_name(cls)}": dump_json(message_schema(cls)) for cls in messages}
    files[ASYNCAPI_FILE] = dump_json(asyncapi_document(messages))
    files[INDEX_FILE] = index_markdown(messages)
    return dict(sorted(files.items()))


def dump_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def stale_files(out_dir: Path, files: dict[str, str]) -> list[Path]:
    """Schema files in `out_dir` that no current message produces."""
    wanted = {out_dir / rel for rel in files}
    schemas = out_dir / SCHEMAS_DIR
    return sorted(p for p in schemas.glob("*.json") if p not in wanted) if schemas.is_dir() else []


def write(out_dir: Path, messages: Sequence[type[Message]] = ALL_MESSAGES) -> list[Path]:
    """Write every generated file (only those whose text changed); return the paths written or removed."""
    files = render(messages)
    changed: list[Path] = []
    for rel, text in files.items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    for path in stale_files(out_dir, files):
        path.unlink()
        changed.append(path)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ibpool_proto.docs", description="Generate docs/events from ibpool_proto."
    )
    parser.add_argument("out_dir", type=Path, help="where to write (docs/events)")
    args = parser.parse_args(argv)
    changed = write(args.out_dir)
    for path in changed:
        print(f"wrote {path}")
    print(f"{len(render())} files in {args.out_dir}, {len(changed)} changed")
    return 0


def _contract_version() -> str:
    try:
        return importlib.metadata.version("ibpool-proto")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


if __name__ == "__main__":
    sys.exit(main())
