"""Property tests of the codec, subjects and ce-types: every message round-trips, and bad input
fails only with `DecodeError`."""

from __future__ import annotations

import json
import re
import string
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibpool_proto import (
    ALL_MESSAGES,
    MESSAGES_BY_CE_TYPE,
    DecodeError,
    Message,
    decode,
    decode_as,
    encode,
    parse_ce_type,
)
from ibpool_proto.message import TypeName
from proto.tests.message_strategies import MESSAGE_TYPES, any_message, messages

CE_TYPE_RE = re.compile(r"^io\.ibpool\.[a-z]+\.[a-z]+\.[a-z]+\.v[1-9][0-9]*$")
FORBIDDEN_IN_KEY = ". *>\t\r\n\x0b\x0c\x00\xa0\u2028"


def is_valid_key(key: str) -> bool:
    """A subject token: printable ASCII, none of '.', '*', '>'."""
    return bool(key) and all("!" <= c <= "~" for c in key) and not any(c in key for c in ".*>")


ALL_FIELD_NAMES = sorted({f.name for m in ALL_MESSAGES for f in msgspec.structs.fields(m)})

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=lambda c: c.ce_type())
@settings(max_examples=40)
@given(data=st.data())
def test_every_message_round_trips(cls: type[Message], data: st.DataObject) -> None:
    message = data.draw(messages(cls))
    wire = encode(message)
    assert decode(wire) == message
    assert decode_as(wire, cls) == message
    assert json.loads(wire)["type"] == cls.ce_type()


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_decode_error(data: bytes) -> None:
    try:
        decode(data)
    except DecodeError:
        pass


@settings(max_examples=300)
@given(json_values)
def test_random_json_raises_only_decode_error(value: Any) -> None:
    try:
        decode(json.dumps(value).encode())
    except DecodeError:
        pass


@settings(max_examples=300)
@given(
    ce_type=st.sampled_from(sorted(MESSAGES_BY_CE_TYPE)),
    fields=st.dictionaries(st.sampled_from(ALL_FIELD_NAMES), json_values, max_size=12),
)
def test_tagged_random_fields_raise_only_decode_error(ce_type: str, fields: dict[str, Any]) -> None:
    """The right tag, random field values: decoding reaches field validation and must fail cleanly."""
    try:
        decoded = decode(json.dumps({**fields, "type": ce_type}).encode())
    except DecodeError:
        return
    assert decoded.ce_type() == ce_type


@settings(max_examples=100)
@given(any_message, st.binary(min_size=1, max_size=8))
def test_truncated_or_garbled_messages_raise_only_decode_error(message: Message, junk: bytes) -> None:
    wire = encode(message)
    for data in (wire[: len(wire) // 2], wire + junk, junk + wire):
        try:
            decode(data)
        except DecodeError:
            pass


def test_unknown_type_is_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        decode(b'{"type": "io.ibpool.pool.allocation.granted.v99", "source": "s", "key": "k"}')


# -- subjects ---------------------------------------------------------------------------------


@given(st.text(alphabet=string.ascii_letters + string.digits + "-_:", min_size=1, max_size=40))
def test_subject_is_root_plus_key(key: str) -> None:
    for cls in MESSAGE_TYPES:
        subject = cls.subject(key)
        assert subject == f"{cls.subject_root()}.{key}"
        assert subject.split(".")[-1] == key
        t = cls.type_name()
        assert subject.split(".")[:4] == ["ibpool", t.domain, t.entity, t.verb]


@given(
    st.text(max_size=10),
    st.sampled_from(list(FORBIDDEN_IN_KEY)),
    st.text(max_size=10),
)
def test_subject_rejects_keys_with_separators_wildcards_or_spaces(before: str, bad: str, after: str) -> None:
    with pytest.raises(ValueError, match="subject key"):
        MESSAGE_TYPES[0].subject(before + bad + after)


def test_subject_rejects_empty_key() -> None:
    with pytest.raises(ValueError):
        MESSAGE_TYPES[0].subject("")


@given(any_message)
def test_subject_of_uses_the_key(message: Message) -> None:
    if not is_valid_key(message.key):
        with pytest.raises(ValueError):
            message.subject_of()
    else:
        assert message.subject_of() == f"{type(message).subject_root()}.{message.key}"


def test_subject_pattern_matches_every_key() -> None:
    for cls in MESSAGE_TYPES:
        assert cls.subject_pattern() == f"{cls.subject_root()}.*"


# -- ce-types ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=lambda c: c.ce_type())
def test_every_ce_type_is_well_formed_and_unique(cls: type[Message]) -> None:
    assert CE_TYPE_RE.match(cls.ce_type()), cls.ce_type()
    assert MESSAGES_BY_CE_TYPE[cls.ce_type()] is cls
    assert cls.summary, f"{cls.__name__} needs a `summary` for the generated docs"
    assert cls.key_name


def test_ce_types_are_unique() -> None:
    assert len(MESSAGES_BY_CE_TYPE) == len(ALL_MESSAGES)


tokens = st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=12)


@given(tokens, tokens, tokens, st.integers(1, 10_000))
def test_parse_ce_type_inverts_formatting(domain: str, entity: str, verb: str, version: int) -> None:
    parsed = parse_ce_type(f"io.ibpool.{domain}.{entity}.{verb}.v{version}")
    assert parsed == TypeName(domain, entity, verb, version)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "io.ibpool",
        "com.example.pool.allocation.granted.v1",
        "io.ibpool.pool.allocation.granted",
        "io.ibpool.pool.allocation.granted.1",
        "io.ibpool.pool.allocation.granted.vX",
        "io.ibpool.pool.allocation.granted.v",
        "io.ibpool.pool.allocation.granted.v1.extra",
        "io.ibpool.allocation.granted.v1",
    ],
)
def test_parse_ce_type_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_ce_type(bad)


def test_naive_timestamps_are_rejected_on_decode() -> None:
    from ibpool_proto.job import CancelJob

    wire = encode(CancelJob(source="s", key="j", job_id="j"))
    naive = wire.replace(b'Z"', b'"', 1)
    assert naive != wire
    with pytest.raises(DecodeError, match="timezone"):
        decode(naive)


@pytest.mark.parametrize("bad", ["io.ibpool..job.cancel.v1", "io.ibpool.job..cancel.v1", "io.ibpool.Job.job.x.v1"])
def test_ce_type_parts_must_be_lower_case_names(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_ce_type(bad)


def test_a_message_is_taken_only_from_the_subject_its_type_and_key_build() -> None:
    from ibpool_proto import misaddressed
    from ibpool_proto.job import CancelJob

    cancel = CancelJob(source="t", key="j1", job_id="j1")
    assert misaddressed(cancel, "ibpool.job.job.cancel.j1") is None
    assert misaddressed(cancel, "ibpool.job.job.cancel.j1", cancel.ce_type()) is None
    assert "its type and key build ibpool.job.job.cancel.j1" in (misaddressed(cancel, "ibpool.job.job.cancel.j2") or "")
    assert "a CancelJob on ibpool.node.node.registered.n1" in (
        misaddressed(cancel, "ibpool.node.node.registered.n1") or ""
    )
    assert "header ce-type" in (misaddressed(cancel, "ibpool.job.job.cancel.j1", "io.ibpool.job.job.submit.v1") or "")
    bad_key = CancelJob(source="t", key="a b", job_id="x")
    assert "cannot be a subject" in (misaddressed(bad_key, "ibpool.job.job.cancel.a b") or "")
    # The key is the field it names: a cancel of j2 under j1's key is neither.
    other = CancelJob(source="t", key="j1", job_id="j2")
    assert "whose job_id is 'j2'" in (misaddressed(other, "ibpool.job.job.cancel.j1") or "")
    assert misaddressed(msgspec.structs.replace(other, key="j2"), "ibpool.job.job.cancel.j2") is None
