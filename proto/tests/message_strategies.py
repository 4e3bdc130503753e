"""Hypothesis strategies for ibpool messages, built from msgspec's own view of each type.

`st.from_type` also builds msgspec Structs (from their `__init__`), but it draws integers beyond
what JSON numbers can carry in msgspec (int64/uint64) and NaN floats (encoded as `null`). This
builder draws only values the wire format can carry, so a failure means a real contract problem.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec.inspect as mi
from hypothesis import strategies as st

from ibpool_proto import ALL_MESSAGES, Message

INT_MIN = -(2**63)
INT_MAX = 2**64 - 1
MESSAGE_TYPES = sorted(ALL_MESSAGES, key=lambda m: m.ce_type())

# Naive, UTC and whole-minute offsets: what RFC 3339 carries (zoneinfo's second-level LMT offsets are not).
_offsets = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))
_datetimes = st.datetimes(timezones=st.none() | st.just(dt.UTC) | _offsets)
_aware_datetimes = st.datetimes(timezones=st.just(dt.UTC) | _offsets)


def for_type(t: mi.Type) -> st.SearchStrategy[Any]:
    """A strategy for any value msgspec can encode as `t` and decode back."""
    if isinstance(t, mi.StrType):
        return st.text(max_size=20)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.IntType):
        return st.integers(INT_MIN, INT_MAX)
    if isinstance(t, mi.FloatType):
        return st.floats(allow_nan=False, allow_infinity=False)
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.DateTimeType):
        return _aware_datetimes if t.tz else _datetimes
    if isinstance(t, mi.UnionType):
        return st.one_of([for_type(x) for x in t.types])
    if isinstance(t, mi.ListType):
        return st.lists(for_type(t.item_type), max_size=4)
    if isinstance(t, mi.DictType):
        return st.dictionaries(for_type(t.key_type), for_type(t.value_type), max_size=4)
    if isinstance(t, mi.StructType):
        return for_struct(t)
    raise NotImplementedError(f"no strategy for msgspec type {t!r}; add one to message_strategies.py")


def for_struct(t: mi.StructType) -> st.SearchStrategy[Any]:
    required = {f.name: for_type(f.type) for f in t.fields if f.required}
    optional = {f.name: for_type(f.type) for f in t.fields if not f.required}
    cls = t.cls
    return st.fixed_dictionaries(required, optional=optional).map(lambda kw: cls(**kw))


def messages(cls: type[Message]) -> st.SearchStrategy[Message]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return for_struct(info)


any_message: st.SearchStrategy[Message] = st.sampled_from(MESSAGE_TYPES).flatmap(messages)


def sample(cls: type[Message]) -> Message:
    """One fixed, valid instance (every required field filled) for schema checks."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    value = _sample(info)
    assert isinstance(value, cls)
    return value


def _sample(t: mi.Type) -> Any:
    if isinstance(t, mi.StrType):
        return "x"
    if isinstance(t, mi.BoolType):
        return True
    if isinstance(t, mi.IntType):
        return 1
    if isinstance(t, mi.FloatType):
        return 1.5
    if isinstance(t, mi.LiteralType):
        return t.values[0]
    if isinstance(t, mi.DateTimeType):
        return dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    if isinstance(t, mi.UnionType):
        non_null = [x for x in t.types if not isinstance(x, mi.NoneType)]
        return _sample(non_null[0]) if non_null else None
    if isinstance(t, mi.ListType):
        return [_sample(t.item_type)]
    if isinstance(t, mi.DictType):
        return {_sample(t.key_type): _sample(t.value_type)}
    if isinstance(t, mi.StructType):
        return t.cls(**{f.name: _sample(f.type) for f in t.fields})
    raise NotImplementedError(f"no sample for msgspec type {t!r}")
