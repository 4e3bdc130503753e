"""HTTP bodies: `ibpool_runtime.http.read_body` of arbitrary bytes, of JSON objects with the body's
field names and random values, and of valid bodies with bytes garbled, raises only `BadBody` (the
400 with the bad field's path); the services' own checks after decoding raise only BadBody too."""

from __future__ import annotations

from typing import Any, cast

import msgspec
import msgspec.inspect as mi
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from ibpool_autoscaler.api import validate as validate_deployment
from ibpool_autoscaler.deployments import DeploymentBody
from ibpool_fabric_monitor.api import Fault
from ibpool_node_agent.api import XidBody
from ibpool_pool_allocator.api import AllocationAsk, QuotaBody
from ibpool_runtime.http import BadBody, read_body
from ibpool_scheduler.api import JobBody, spec_of
from proto.tests.message_strategies import for_struct
from tests.fuzz.budget import FUZZ, json_values, mutated

BODIES: list[type[msgspec.Struct]] = [JobBody, DeploymentBody, AllocationAsk, QuotaBody, Fault, XidBody]


class _Request:
    """What read_body uses of an aiohttp request: its content type and the raw body."""

    content_type = "application/json"

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def read(self) -> bytes:
        return self.body


def run(body: bytes, body_type: type[Any]) -> Any:
    """read_body on `body`; it never waits (the body is in hand), so one step of the coroutine runs it."""
    coroutine = read_body(cast(web.Request, _Request(body)), body_type)
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("read_body waited on a body already read")


def decode(body: bytes, body_type: type[Any]) -> Any:
    try:
        value = run(body, body_type)
    except BadBody as e:
        assert e.detail
        assert e.path is None or e.path.startswith("$")
        return None
    assert isinstance(value, body_type)
    return value


def loose_objects(body_type: type[msgspec.Struct]) -> st.SearchStrategy[bytes]:
    """JSON objects with some of the body's field names (and a stray one), values of any JSON type."""
    names = [f.name for f in msgspec.structs.fields(body_type)] + ["unknown"]
    return st.fixed_dictionaries({}, optional=dict.fromkeys(names, json_values)).map(msgspec.json.encode)


def well_typed(body_type: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    info = mi.type_info(body_type)
    assert isinstance(info, mi.StructType)
    return for_struct(info)


def then_checked(body_type: type[Any], value: Any) -> None:
    """The checks a service runs on a decoded body: BadBody or a usable value."""
    if value is None:
        return
    try:
        if body_type is JobBody:
            spec_of(value)
        elif body_type is DeploymentBody:
            validate_deployment("fuzzed", value)
    except BadBody as e:
        assert e.detail


@pytest.mark.parametrize("body_type", BODIES, ids=lambda t: t.__name__)
@FUZZ
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes(body_type: type[Any], data: bytes) -> None:
    decode(data, body_type)


@pytest.mark.parametrize("body_type", BODIES, ids=lambda t: t.__name__)
@FUZZ
@given(data=st.data())
def test_objects_with_the_body_fields(body_type: type[Any], data: st.DataObject) -> None:
    then_checked(body_type, decode(data.draw(loose_objects(body_type)), body_type))


@pytest.mark.parametrize("body_type", BODIES, ids=lambda t: t.__name__)
@FUZZ
@given(data=st.data())
def test_well_typed_bodies_and_near_misses(body_type: type[Any], data: st.DataObject) -> None:
    wire = msgspec.json.encode(data.draw(well_typed(body_type)))
    then_checked(body_type, decode(wire, body_type))
    then_checked(body_type, decode(data.draw(mutated(wire)), body_type))


def test_a_nul_in_any_string_is_a_bad_body_naming_the_field() -> None:
    with pytest.raises(BadBody) as e:
        run(b'{"tenant": "a\\u0000b"}', JobBody)
    assert e.value.path == "$.tenant"
