"""The JetStream streams of ibpool, declared once: one per domain plus the dead-letter stream."""

from __future__ import annotations

from typing import NamedTuple

from ibpool_proto.codec import ALL_MESSAGES

DLQ_STREAM = "IBPOOL_DLQ"
DLQ_SUBJECT_PREFIX = "ibpool.dlq"

DAY_S = 86_400.0


class StreamSpec(NamedTuple):
    name: str
    subjects: tuple[str, ...]
    max_age_s: float
    # JetStream drops a second message with the same Nats-Msg-Id inside this window.
    duplicate_window_s: float = 120.0
    max_bytes: int = -1
    description: str = ""
    # limits: messages stay until max_age/max_bytes, whoever consumed them (many independent subscribers).
    retention: str = "limits"


def stored_subjects(domain: str) -> tuple[str, ...]:
    """The subjects of `domain` a stream holds: `ibpool.<domain>.<entity>.>` for each entity with a
    stored message; those of messages sent on core NATS only (`Message.stored`) are left out."""
    ours = [m for m in ALL_MESSAGES if m.type_name().domain == domain]
    entities = {m.type_name().entity for m in ours if m.stored}
    shared = sorted(m.__name__ for m in ours if not m.stored and m.type_name().entity in entities)
    if shared:  # a stream's subjects go by entity: an unstored message needs an entity of its own
        raise ValueError(f"{', '.join(shared)}: not stored, but on an entity whose other messages are")
    return tuple(f"ibpool.{domain}.{e}.>" for e in sorted(entities))


STREAMS: tuple[StreamSpec, ...] = (
    # Heartbeats are not stored (core NATS only): one per node per second.
    StreamSpec("IBPOOL_NODE", stored_subjects("node"), 1 * DAY_S, description="registrations, telemetry, HCA ports"),
    StreamSpec("IBPOOL_FABRIC", ("ibpool.fabric.>",), 30 * DAY_S, description="topology versions, link state"),
    StreamSpec("IBPOOL_POOL", ("ibpool.pool.>",), 30 * DAY_S, description="ledger commands and allocation events"),
    StreamSpec("IBPOOL_JOB", ("ibpool.job.>",), 30 * DAY_S, description="job submissions and lifecycle"),
    StreamSpec("IBPOOL_SCALE", ("ibpool.scale.>",), 30 * DAY_S, description="autoscaler decisions"),
    StreamSpec("IBPOOL_HEALTH", ("ibpool.health.>",), 30 * DAY_S, description="health verdicts and actions"),
    StreamSpec(
        "IBPOOL_SLURM", ("ibpool.slurm.>",), 30 * DAY_S, description="a Slurm cluster's nodes as Slurm shows them"
    ),
    StreamSpec(DLQ_STREAM, (f"{DLQ_SUBJECT_PREFIX}.>",), 14 * DAY_S, description="messages no handler could take"),
)


def stream_for_subject(subject: str) -> str:
    for spec in STREAMS:
        for pattern in spec.subjects:
            if subject.startswith(pattern.removesuffix(">")):
                return spec.name
    raise KeyError(f"no ibpool stream holds subject {subject!r}")
