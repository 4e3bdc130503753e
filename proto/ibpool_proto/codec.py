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
    JobFinished,
    JobPreempted,
    JobQueued,
    JobRequeued,
    JobScheduled,
    JobStarted,
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


def decode_as(data: bytes, message_type: type[M]) -> M:
    return msgspec.json.decode(data, type=message_type)


def domains() -> list[str]:
    return sorted({m.type_name().domain for m in ALL_MESSAGES})
