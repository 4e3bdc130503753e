"""What the chaos suite's attacker sends: built from the contract, aimed at what is live.

The attacker holds one node agent's NATS credentials (issue 20's threat): that agent's own user,
allowed only its nodes' subjects (`bus_permissions.agent_permissions`). `plan` builds, for every
subject that user may publish, a well-formed message of every other type of the contract (type
confusion: a `RequestAllocation`, `NodeFailed`, `ProposePlacement` with a fencing term of 10^9, an
unsigned `AllocationGranted`, a `ReleaseAllocation` of a live allocation, ...), each aimed at
another agent's node and a live allocation, its job ids and reasons marked `attack`, and each
stored one carrying `Nats-Expected-Stream` (the header that once let a message escape the DLQ). It
adds what that user may not do at all: the node agents' own messages about another agent's node
(an XID report, a heartbeat, a job's exit, a registration), reading another agent's durable,
publishing a grant (forged, and a real signed one replayed), failing a node, proposing a
placement, asking for GPUs, deleting, fetching from or re-filtering the allocator's durable,
making or purging a stream; and subjects to snoop on. `attacker.py` carries the plan out from its
own container.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
import msgspec.inspect as mi

from ibpool_proto import ALL_MESSAGES, Message
from ibpool_proto.health import NodeFailed
from ibpool_proto.job import JobExitedV2
from ibpool_proto.node import NodeHeartbeat, NodeRegistered, TelemetryReported
from ibpool_proto.pool import AllocationGranted, ProposePlacement, RequestAllocation
from ibpool_runtime.bus import envelope_headers, inbox_prefix
from ibpool_runtime.bus_permissions import PUBLISHES, AgentGrant
from ibpool_runtime.streams import stream_for_subject
from proto.tests.message_strategies import sample

from .invariants import Recorded

USER = "node_agent"  # the messages it may send are the node agents'; its user is one agent's own
MARK = "attack"  # in every job id and reason the attacker writes: an event of ours carrying it acted on the attack
ATTACK_TERM = 10**9
ROUNDS = 2
PAUSE_S = 2.0
DEADLINE_S = 90.0  # for all the crafted messages: a server that stops acking ends the attack, said so
# Replies meant for other users, and events this user may only read through its own durables.
SNOOP = ("_INBOX.>", "_INBOX_pool_allocator.>", "_INBOX_scheduler.>", "ibpool.pool.>")
VICTIM_DURABLE = ("IBPOOL_POOL", "pool-allocator-commands")
PLANTED_FILTER = "ibpool.pool.nothing.>"  # what the attacker tries to re-filter that durable to


@dataclass(frozen=True)
class Plan:
    crafted: list[dict[str, Any]]  # subject, headers, data (JSON text), stored
    forbidden: list[dict[str, Any]]  # what, subject, data, headers
    victim_node: str
    user: str  # whose credentials the attacker holds (its replies come to that user's inboxes only)

    @property
    def stored_subjects(self) -> set[str]:
        return {p["subject"] for p in self.crafted if p["stored"]}

    def to_json(self) -> str:
        return json.dumps(
            {
                "crafted": self.crafted,
                "forbidden": self.forbidden,
                "snoop": list(SNOOP),
                "rounds": ROUNDS,
                "pause_s": PAUSE_S,
                "deadline_s": DEADLINE_S,
                "inbox_prefix": inbox_prefix(self.user),
            }
        )


def _fits(t: mi.Type, value: object) -> bool:
    """Whether `value` is one msgspec would decode as `t` (only strings and integers are put in)."""
    if isinstance(t, mi.UnionType):
        return any(_fits(x, value) for x in t.types)
    if isinstance(value, str):
        if not isinstance(t, mi.StrType):
            return False
        short_enough = t.max_length is None or len(value) <= t.max_length
        return short_enough and (t.pattern is None or re.search(t.pattern, value) is not None)
    if isinstance(value, int):
        return isinstance(t, mi.IntType) and (t.le is None or value <= t.le) and (t.lt is None or value < t.lt)
    return False


def aimed(cls: type[Message], *, victim_node: str, live: AllocationGranted | None) -> Message:
    """A valid `cls` (every field filled) aimed at the victims, its own ids and reasons marked."""
    aims: dict[str, object] = {
        "source": MARK,
        "node_id": victim_node,
        "job_id": f"{MARK}-{cls.__name__}",
        "allocation_id": live.allocation_id if live else f"{MARK}-allocation",
        "tenant": MARK,
        "holder": MARK,
        "reason": MARK,
        "fencing_term": ATTACK_TERM,
        "scheduler_group": live.scheduler_group if live else "",
    }
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    fields = {f.name: f.type for f in info.fields}
    message = sample(cls)
    changes = {k: v for k, v in aims.items() if k in fields and _fits(fields[k], v)}
    message = msgspec.structs.replace(message, **changes)
    key = getattr(message, cls.key_name, "") if cls.key_name in fields else ""
    try:
        cls.subject(str(key))
    except ValueError:
        key = MARK
    return msgspec.structs.replace(message, key=str(key))


def plan(
    user: str,
    grant: AgentGrant,
    victim_node: str,
    live: AllocationGranted | None,
    live_raw: Recorded | None,
    other_durable: str,
) -> Plan:
    """Everything the attacker sends, holding `user`, the agent of `grant`'s own (its nodes, its
    durable): `victim_node` is another agent's node, `live` a granted allocation still held (on it,
    where one was), `live_raw` its stored message (body and the allocator's signature headers) to
    replay, `other_durable` another agent's durable."""
    crafted = []
    own_node = grant.nodes[0]
    roots = sorted({m.subject_root(): m.stored for m in PUBLISHES[USER]}.items())
    for root, stored in roots:
        for cls in sorted(ALL_MESSAGES, key=lambda m: m.ce_type()):
            if cls.subject_root() == root:
                continue  # the messages the subject is for are this user's to send: not type confusion
            # Under its own node's key (the only one it may use), each with its own id (a repeated
            # Nats-Msg-Id would be dropped by the stream as a duplicate).
            message = aimed(cls, victim_node=victim_node, live=live)
            message = msgspec.structs.replace(message, key=own_node, id=uuid.uuid4().hex)
            subject = f"{root}.{own_node}"
            headers = envelope_headers(message, with_trace=False)
            if stored:
                headers["Nats-Expected-Stream"] = stream_for_subject(subject)
            crafted.append(
                {
                    "subject": subject,
                    "headers": headers,
                    "data": msgspec.json.encode(message).decode(),
                    "stored": stored,
                }
            )

    def forbidden(what: str, message: Message) -> dict[str, Any]:
        return {
            "what": what,
            "subject": message.subject_of(),
            "data": msgspec.json.encode(message).decode(),
            "headers": envelope_headers(message, with_trace=False),
        }

    def victims(cls: type[Message]) -> Message:
        return aimed(cls, victim_node=victim_node, live=live)

    refused = [
        # What the shared `node_agent` user could do to every node: its own user may not, for others'.
        forbidden("report telemetry of another agent's node", victims(TelemetryReported)),
        forbidden("beat for another agent's node", victims(NodeHeartbeat)),
        forbidden("end a job on another agent's node", victims(JobExitedV2)),
        forbidden("register a node of another agent", victims(NodeRegistered)),
        {
            "what": "fetch from another agent's durable",
            "subject": f"$JS.API.CONSUMER.MSG.NEXT.IBPOOL_POOL.{other_durable}",
        },
        forbidden("publish a forged grant", aimed(AllocationGranted, victim_node=victim_node, live=live)),
        forbidden("fail a node", aimed(NodeFailed, victim_node=victim_node, live=live)),
        forbidden("propose a placement on term 10^9", aimed(ProposePlacement, victim_node=victim_node, live=live)),
        forbidden("ask for GPUs", aimed(RequestAllocation, victim_node=victim_node, live=live)),
    ]
    if live_raw is not None:
        refused.append(
            {
                "what": "replay a signed grant",
                "subject": live_raw.subject,
                "data": live_raw.data.decode(),
                "headers": {k: v for k, v in live_raw.headers.items() if not k.startswith("Nats-")},
            }
        )
    stream, durable = VICTIM_DURABLE
    refused += [
        {"what": "delete the allocator's durable", "subject": f"$JS.API.CONSUMER.DELETE.{stream}.{durable}"},
        {"what": "fetch from the allocator's durable", "subject": f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"},
        {
            "what": "re-filter the allocator's durable",
            "subject": f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
            "data": json.dumps(
                {"stream_name": stream, "config": {"durable_name": durable, "filter_subject": PLANTED_FILTER}}
            ),
        },
        {"what": "make a stream", "subject": f"$JS.API.STREAM.CREATE.{MARK.upper()}"},
        {"what": "purge the pool stream", "subject": f"$JS.API.STREAM.PURGE.{stream}"},
    ]
    for r in refused:
        r.setdefault("data", "{}")
    return Plan(crafted=crafted, forbidden=refused, victim_node=victim_node, user=user)
