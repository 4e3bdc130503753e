"""The published docs (docs/events) are generated from the code, well formed, and describe the wire."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from jsonschema import Draft202012Validator

from ibpool_proto import Message, encode
from ibpool_proto import docs as gen
from ibpool_proto.codec import ALL_MESSAGES
from ibpool_runtime.bus import envelope_headers
from ibpool_runtime.streams import stream_for_subject
from proto.tests.message_strategies import MESSAGE_TYPES, any_message, sample

DOCS = Path(__file__).resolve().parents[2] / "docs" / "events"
REGENERATE = "run `make docs` (python -m ibpool_proto.docs docs/events) and commit the result"


def committed_asyncapi() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DOCS / gen.ASYNCAPI_FILE).read_text(encoding="utf-8"))
    return data


def committed_schema(cls: type[Message]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DOCS / gen.SCHEMAS_DIR / gen.schema_file_name(cls)).read_text("utf-8"))
    return data


# -- generated files are up to date -----------------------------------------------------------


def test_committed_docs_match_the_code(tmp_path: Path) -> None:
    assert gen.main([str(tmp_path)]) == 0
    generated = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert generated == sorted(gen.render())
    stale = [p.relative_to(DOCS).as_posix() for p in gen.stale_files(DOCS, gen.render())]
    assert not stale, f"docs/events has schemas of messages that no longer exist: {stale}; {REGENERATE}"
    differ = [
        rel
        for rel in generated
        if not (DOCS / rel).exists()
        or (DOCS / rel).read_text(encoding="utf-8") != (tmp_path / rel).read_text(encoding="utf-8")
    ]
    assert not differ, f"docs/events is out of date with the code ({', '.join(differ)}): {REGENERATE}"


def test_generation_is_deterministic() -> None:
    assert gen.render() == gen.render()
    assert gen.render(list(reversed(ALL_MESSAGES))) == gen.render()


def test_write_removes_schemas_of_removed_messages(tmp_path: Path) -> None:
    gen.write(tmp_path)
    gone = tmp_path / gen.SCHEMAS_DIR / "io.ibpool.pool.allocation.vanished.v1.json"
    gone.write_text("{}")
    keep = tmp_path / "README.md"
    keep.write_text("hand-written")
    assert gen.write(tmp_path) == [gone]
    assert not gone.exists() and keep.exists()


# -- the AsyncAPI document --------------------------------------------------------------------


def test_asyncapi_top_level() -> None:
    doc = committed_asyncapi()
    assert doc["asyncapi"] == "3.0.0"
    assert doc["info"]["title"] and doc["info"]["version"]
    for key in ("channels", "operations", "components"):
        assert isinstance(doc[key], dict) and doc[key], key
    assert {s["protocol"] for s in doc["servers"].values()} == {"nats"}


def test_asyncapi_channels_and_operations() -> None:
    doc = committed_asyncapi()
    for cid, channel in doc["channels"].items():
        assert channel["address"].startswith("ibpool."), cid
        assert channel["messages"], cid
        (param,) = channel["parameters"]
        assert channel["address"].endswith(f".{{{param}}}"), cid
    for oid, op in doc["operations"].items():
        assert op["action"] in ("send", "receive"), oid
        assert op["channel"]["$ref"].startswith("#/channels/"), oid
        assert op["messages"], oid
        channel_ref = op["channel"]["$ref"]
        assert all(m["$ref"].startswith(channel_ref + "/messages/") for m in op["messages"]), oid


def test_asyncapi_covers_every_message_once() -> None:
    doc = committed_asyncapi()
    assert set(doc["components"]["messages"]) == {m.ce_type() for m in ALL_MESSAGES}
    in_channels = [ce for ch in doc["channels"].values() for ce in ch["messages"]]
    in_operations = [m["$ref"].rsplit("/", 1)[-1] for op in doc["operations"].values() for m in op["messages"]]
    assert sorted(in_channels) == sorted(in_operations) == sorted(m.ce_type() for m in ALL_MESSAGES)
    for cls in ALL_MESSAGES:
        message = doc["components"]["messages"][cls.ce_type()]
        assert message["contentType"] == "application/json"
        assert message["summary"] == cls.summary
        assert message["headers"]["properties"]["ce-type"]["const"] == cls.ce_type()
        channel = doc["channels"][gen.channel_id(cls)]
        # A channel is addressed by its newest version's key (JobExited v2 is keyed by node).
        versions = [m for m in ALL_MESSAGES if m.subject_root() == cls.subject_root()]
        head = max(versions, key=lambda m: m.type_name().version)
        assert channel["address"] == f"{cls.subject_root()}.{{{head.key_name}}}"


def test_every_ref_in_asyncapi_resolves() -> None:
    doc = committed_asyncapi()
    refs = list(_refs(doc))
    assert refs
    for ref in refs:
        assert ref.startswith("#/"), f"{ref} points outside the document"
        _resolve(doc, ref)


def test_asyncapi_payload_and_header_schemas_accept_what_the_bus_sends() -> None:
    doc = committed_asyncapi()
    for cls in ALL_MESSAGES:
        message = sample(cls)
        component = doc["components"]["messages"][cls.ce_type()]
        # The payload $ref points into components: validate against the whole document as root.
        root = {"$ref": component["payload"]["$ref"], "components": doc["components"]}
        payload = Draft202012Validator(root)
        payload.validate(json.loads(encode(message)))
        headers = Draft202012Validator(component["headers"])
        sent = envelope_headers(message, with_trace=False)
        headers.validate(sent)
        assert not headers.is_valid({**sent, "ce-type": "io.ibpool.x.y.z.v1"})


def test_documented_streams_are_the_runtime_streams() -> None:
    for cls in ALL_MESSAGES:
        if not cls.stored:
            assert gen.stream_of(cls) == "none"
            with pytest.raises(KeyError):
                stream_for_subject(cls.subject("k"))
            continue
        assert stream_for_subject(cls.subject("k")) == gen.stream_of(cls), cls.ce_type()


# -- the JSON Schema files --------------------------------------------------------------------


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=lambda c: c.ce_type())
def test_schema_file_is_valid_and_accepts_a_sample(cls: type[Message]) -> None:
    schema = committed_schema(cls)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == cls.__name__
    assert schema["description"] == cls.summary
    validator = Draft202012Validator(schema)
    payload = json.loads(encode(sample(cls)))
    validator.validate(payload)
    assert not validator.is_valid({**payload, "type": "io.ibpool.other.thing.done.v1"})
    assert not validator.is_valid({"type": cls.ce_type()}), "required fields are not enforced"


_validators = {cls: Draft202012Validator(committed_schema(cls)) for cls in ALL_MESSAGES}


@settings(max_examples=200)
@given(any_message)
def test_every_encoded_message_validates_against_its_schema(message: Message) -> None:
    _validators[type(message)].validate(json.loads(encode(message)))


def test_index_lists_every_message() -> None:
    index = (DOCS / gen.INDEX_FILE).read_text(encoding="utf-8")
    for cls in ALL_MESSAGES:
        assert f"`{cls.ce_type()}`" in index
        assert f"`{gen.channel_address(cls)}`" in index


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _resolve(doc: Any, ref: str) -> Any:
    node = doc
    for token in ref[2:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and token in node, f"$ref {ref} does not resolve (no {token!r})"
        node = node[token]
    return node
