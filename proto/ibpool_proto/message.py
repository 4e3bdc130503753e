"""The envelope every ibpool message carries, and how a message type names its subject.

A message type is a frozen, keyword-only msgspec Struct tagged with its CloudEvents type
(`io.ibpool.<domain>.<entity>.<verb>.v<N>`). The subject is derived from that tag, so a service
never writes a subject literal: `AllocationGranted.subject(node_id)`.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from typing import Annotated, ClassVar, NamedTuple

import msgspec
import uuid_utils

CE_PREFIX = "io.ibpool."
SUBJECT_PREFIX = "ibpool."

# A point in time with its timezone; a naive datetime is rejected on decode.
Timestamp = Annotated[dt.datetime, msgspec.Meta(tz=True)]

# A subject token: printable ASCII without the separator and the wildcards.
_KEY = re.compile(r"[!-~]+")  # used with fullmatch: `$` would let a trailing newline through
_NAME = re.compile(r"^[a-z][a-z0-9_]*\Z")


def new_id() -> str:
    """A fresh UUIDv7 as a string: time-ordered, so ids sort roughly by creation."""
    return str(uuid_utils.uuid7())


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class TypeName(NamedTuple):
    domain: str
    entity: str
    verb: str
    version: int


def parse_ce_type(ce_type: str) -> TypeName:
    """Split `io.ibpool.<domain>.<entity>.<verb>.v<N>` into its parts; ValueError if it is not one."""
    if not ce_type.startswith(CE_PREFIX):
        raise ValueError(f"ce-type {ce_type!r} does not start with {CE_PREFIX!r}")
    parts = ce_type[len(CE_PREFIX) :].split(".")
    if (
        len(parts) != 4
        or not all(_NAME.match(p) for p in parts[:3])
        or not parts[3].startswith("v")
        or not parts[3][1:].isdigit()
    ):
        raise ValueError(f"ce-type {ce_type!r} is not io.ibpool.<domain>.<entity>.<verb>.v<N>")
    return TypeName(parts[0], parts[1], parts[2], int(parts[3][1:]))


@functools.cache
def _type_name(ce_type: str) -> TypeName:
    return parse_ce_type(ce_type)


@functools.cache
def _subject_root(ce_type: str) -> str:
    t = _type_name(ce_type)
    return f"{SUBJECT_PREFIX}{t.domain}.{t.entity}.{t.verb}"


class Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", forbid_unknown_fields=False):
    """Base of every event and command on the bus.

    Envelope fields: `id` (UUIDv7, also `Nats-Msg-Id` and `ce-id`), `occurred_at` (UTC),
    `source` (the emitting service instance), `key` (the last subject token: node, job or
    allocation id, see `key_name`), `schema_version`. Unknown fields are ignored on decode so
    that adding an optional field is a compatible change.
    """

    # What the subject key is, for documentation (the AsyncAPI channel parameter).
    key_name: ClassVar[str] = "key"
    # One line that says what the message means; the generated docs use it.
    summary: ClassVar[str] = ""
    # Stored in its domain's JetStream stream (False: core NATS only, for live readers; the next
    # message replaces a lost one and nobody needs its history).
    stored: ClassVar[bool] = True

    id: str = msgspec.field(default_factory=new_id)
    occurred_at: Timestamp = msgspec.field(default_factory=utc_now)
    source: str
    key: str
    schema_version: int = 1

    @classmethod
    def ce_type(cls) -> str:
        tag = cls.__struct_config__.tag
        assert isinstance(tag, str), f"{cls.__name__} has no string tag"
        return tag

    @classmethod
    def type_name(cls) -> TypeName:
        return _type_name(cls.ce_type())

    @classmethod
    def subject(cls, key: str) -> str:
        """The subject for this message with the given key: `ibpool.<domain>.<entity>.<verb>.<key>`."""
        if not _KEY.fullmatch(key) or any(c in key for c in ".*>"):
            raise ValueError(
                f"subject key {key!r} must be a non-empty token of printable ASCII without '.', '*', '>' or spaces"
            )
        return f"{cls.subject_root()}.{key}"

    @classmethod
    def subject_root(cls) -> str:
        return _subject_root(cls.ce_type())

    @classmethod
    def subject_pattern(cls) -> str:
        """The wildcard filter that matches this message for every key."""
        return f"{cls.subject_root()}.*"

    def subject_of(self) -> str:
        return type(self).subject(self.key)


class Event(Message, frozen=True, kw_only=True):
    """Something that happened (past tense: AllocationGranted)."""


class Command(Message, frozen=True, kw_only=True):
    """Something a service is asked to do (imperative: ProposePlacement)."""


def every_subject() -> str:
    """The filter that matches every ibpool subject (for observers such as `ibpool run`)."""
    return f"{SUBJECT_PREFIX}>"
