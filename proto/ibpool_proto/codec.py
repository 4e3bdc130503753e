"""Encoding and decoding of every message on the bus: one tagged union, decoded once."""

from __future__ import annotations

from typing import TypeVar

import msgspec

from .fabric import LinkDegraded, LinkFlapping, LinkRecovered, LinkStateChanged, TopologyPublished
from .health import (
    ClusterDegraded,
    ClusterRestored,
    Cordoned,
    DrainRequested,
    GpuFailed,
    GpuRecovered,
    JobFlagged,
    NodeFailed,
    NodeRecovered,
    NodeSuspected,
    RequeueRequested,
    Uncordoned,
)
from .job import (
    CancelJob,
    JobExited,
    JobExitedV2,
    JobFinished,
    JobPreempted,
    JobQueued,
    JobRequeued,
    JobScheduled,
    JobStarted,
    JobStartedV2,
    SubmitJob,
)
from .message import Message
from .node import HcaPortsReported, NodeDeregistered, NodeHeartbeat, NodeRegistered, TelemetryReported
from .pool import (
    AllocationExpired,
    AllocationGranted,
    AllocationRejected,
    AllocationReleased,
    AllocationRevoked,
    LeaseRenewed,
    PoolNodeUpdated,
    ProposePlacement,
    ProposePlacements,
    QuotaChanged,
    ReleaseAllocation,
    RenewLease,
    ReplaceGangMember,
    RequestAllocation,
    SetQuota,
)
from .scale import DeploymentMetricsReported, ElasticJobResized, ScaleDecided
from .slurm import SlurmNodeChanged

AnyMessage = (
    NodeRegistered
    | NodeDeregistered
    | NodeHeartbeat
    | TelemetryReported
    | HcaPortsReported
    | TopologyPublished
    | LinkStateChanged
    | LinkDegraded
    | LinkFlapping
    | LinkRecovered
    | ProposePlacement
    | ProposePlacements
    | RequestAllocation
    | ReleaseAllocation
    | RenewLease
    | ReplaceGangMember
    | AllocationGranted
    | AllocationRejected
    | AllocationReleased
    | AllocationRevoked
    | AllocationExpired
    | LeaseRenewed
    | PoolNodeUpdated
    | SetQuota
    | QuotaChanged
    | SubmitJob
    | CancelJob
    | JobStarted
    | JobExited
    | JobStartedV2
    | JobExitedV2
    | JobQueued
    | JobScheduled
    | JobPreempted
    | JobRequeued
    | JobFinished
    | ScaleDecided
    | DeploymentMetricsReported
    | ElasticJobResized
    | NodeSuspected
    | NodeFailed
    | NodeRecovered
    | GpuFailed
    | GpuRecovered
    | Cordoned
    | Uncordoned
    | DrainRequested
    | RequeueRequested
    | JobFlagged
    | ClusterDegraded
    | ClusterRestored
    | SlurmNodeChanged
)

ALL_MESSAGES: tuple[type[Message], ...] = AnyMessage.__args__
MESSAGES_BY_CE_TYPE: dict[str, type[Message]] = {m.ce_type(): m for m in ALL_MESSAGES}

DecodeError = msgspec.DecodeError
"""Raised for bytes that are not a valid message (bad JSON, unknown type, wrong field)."""

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[AnyMessage] = msgspec.json.Decoder(AnyMessage)

M = TypeVar("M", bound=Message)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes) -> AnyMessage:
    """Decode any ibpool message. Raises only `DecodeError` (ValidationError is a subclass)."""
    return _decoder.decode(data)


def misaddressed(message: Message, subject: str, ce_type: str | None = None) -> str | None:
    """Why `message` may not be taken from `subject`, or None when it may: the subject must be
    exactly the one its type and key build (`Message.subject_of`), so a body of one type published
    on another type's subject (which a publisher may be allowed to use) is refused, whatever the
    subscription; `ce_type`, the `ce-type` header when there is one, must name the body's type. The
    key must be the field it names (`key_name`), so that a permission to publish one key's subject
    is a permission for that key's messages only."""
    try:
        built = message.subject_of()
    except ValueError as e:
        return f"a {type(message).__name__} whose key cannot be a subject: {e}"
    named = getattr(message, message.key_name, None) if message.key_name != "key" else None
    if isinstance(named, str) and named != message.key:
        return f"a {type(message).__name__} keyed {message.key!r} whose {message.key_name} is {named!r}"
    if built != subject:
        return f"a {type(message).__name__} on {subject}; its type and key build {built}"
    if ce_type is not None and ce_type != message.ce_type():
        return f"a {type(message).__name__} body with header ce-type {ce_type}"
    return None


def decode_as(data: bytes, message_type: type[M]) -> M:
    return msgspec.json.decode(data, type=message_type)


def domains() -> list[str]:
    return sorted({m.type_name().domain for m in ALL_MESSAGES})
