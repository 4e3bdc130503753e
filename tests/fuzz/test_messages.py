"""Events and commands: `ibpool_proto.decode` of arbitrary bytes and of near-misses of valid
messages raises only `ibpool_proto.DecodeError` (msgspec's; ValidationError is a subclass)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ibpool_proto import ALL_MESSAGES, DecodeError, Message, decode, decode_as, encode, parse_ce_type
from proto.tests.message_strategies import any_message
from tests.fuzz.budget import FUZZ, json_values, mutated

FIELDS = sorted({f.name for m in ALL_MESSAGES for f in msgspec.structs.fields(m)})


def decodes_or_rejects(data: bytes) -> None:
    try:
        message = decode(data)
    except DecodeError:
        return
    assert isinstance(message, Message)
    assert decode(encode(message)) == message  # what decodes re-encodes to the same message


@FUZZ
@given(st.binary(max_size=400))
def test_arbitrary_bytes(data: bytes) -> None:
    decodes_or_rejects(data)


@FUZZ
@given(st.data())
def test_mutated_valid_messages(data: st.DataObject) -> None:
    wire = encode(data.draw(any_message))
    decodes_or_rejects(data.draw(mutated(wire)))


@FUZZ
@given(any_message, st.sampled_from(FIELDS), json_values)
def test_valid_message_with_one_field_replaced(message: Message, field: str, value: Any) -> None:
    raw = msgspec.json.decode(encode(message))
    raw[field] = value
    decodes_or_rejects(msgspec.json.encode(raw))


@FUZZ
@given(any_message, st.data())
def test_valid_message_with_one_field_removed(message: Message, data: st.DataObject) -> None:
    raw = msgspec.json.decode(encode(message))
    del raw[data.draw(st.sampled_from(sorted(raw)))]
    decodes_or_rejects(msgspec.json.encode(raw))


@FUZZ
@given(any_message, st.sampled_from(sorted(ALL_MESSAGES, key=lambda m: m.ce_type())))
def test_decode_as_another_type(message: Message, other: type[Message]) -> None:
    try:
        assert isinstance(decode_as(encode(message), other), other)
    except DecodeError:
        pass


@FUZZ
@given(st.text(max_size=60) | st.sampled_from([m.ce_type() for m in ALL_MESSAGES]).map(lambda t: t[:-1] + "x"))
def test_ce_type_parsing_raises_only_value_error(ce_type: str) -> None:
    try:
        name = parse_ce_type(ce_type)
    except ValueError:
        return
    assert name.version >= 0


def test_the_documented_error_is_msgspecs() -> None:
    assert DecodeError is msgspec.DecodeError
    assert issubclass(msgspec.ValidationError, DecodeError)
    with pytest.raises(DecodeError):
        decode(b'{"type": "io.ibpool.nope.nope.nope.v1"}')
