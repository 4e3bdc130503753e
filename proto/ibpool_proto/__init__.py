"""ibpool_proto: the contract between ibpool services and the systems that subscribe to them.

Every event, command and HTTP body is a frozen, keyword-only msgspec Struct. Bus messages are
tagged with their CloudEvents type and grouped by domain: node, fabric, pool, job, scale, health.
"""

from .codec import (
    ALL_MESSAGES,
    MESSAGES_BY_CE_TYPE,
    AnyMessage,
    DecodeError,
    decode,
    decode_as,
    domains,
    encode,
    misaddressed,
)
from .message import Command, Event, Message, new_id, parse_ce_type, utc_now

__all__ = [
    "ALL_MESSAGES",
    "MESSAGES_BY_CE_TYPE",
    "AnyMessage",
    "Command",
    "DecodeError",
    "Event",
    "Message",
    "decode",
    "decode_as",
    "domains",
    "encode",
    "misaddressed",
    "new_id",
    "parse_ce_type",
    "utc_now",
]
