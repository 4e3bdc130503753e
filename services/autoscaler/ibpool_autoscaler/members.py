"""A member job's life, the same for a deployment's replicas and an elastic job's workers: pure.

A member is `down` (a replica `starting`, a worker `queued`) from its submission until the workload of
its allocation started on every host it spans, then `up` (`ready`, `running`); a requeue puts it down
again. JobScheduled tells its allocation and hosts; each host's JobStarted (the agent's, which may come
before JobScheduled) adds that host to `started`. JobFinished ends it.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal, TypeVar

import msgspec

from ibpool_proto.job import JobFinished, JobRequeued, JobScheduled, JobStarted

from .deployments import ReplicaRecord
from .elastic import WorkerRecord

M = TypeVar("M", ReplicaRecord, WorkerRecord)
MemberNews = JobScheduled | JobStarted | JobRequeued | JobFinished
GONE: Literal["gone"] = "gone"


def up_state(member: ReplicaRecord | WorkerRecord) -> str:
    return "ready" if isinstance(member, ReplicaRecord) else "running"


def down_state(member: ReplicaRecord | WorkerRecord) -> str:
    return "starting" if isinstance(member, ReplicaRecord) else "queued"


def after_news(member: M, ev: MemberNews, now: dt.datetime) -> M | Literal["gone"] | None:
    """The member after `ev`: the changed record, None when nothing changes, GONE when its job ended."""
    up, down = up_state(member), down_state(member)
    same = member.allocation_id == ev.allocation_id if not isinstance(ev, JobFinished) else False
    match ev:
        case JobFinished():
            return GONE
        case JobRequeued():
            if member.allocation_id not in (None, ev.allocation_id):
                return None  # news of an allocation it no longer holds
            changed = msgspec.structs.replace(member, allocation_id=None, nodes=[], started=[])
            changed = _moved(changed, down, now)
        case JobScheduled():
            # The agents' JobStarted may come first: placing a member that started does not put it down.
            started = member.started if same else []
            changed = msgspec.structs.replace(
                member, allocation_id=ev.allocation_id, nodes=sorted(ev.nodes), started=started
            )
            if len(started) >= member.hosts:
                changed = _moved(changed, up, now)
        case JobStarted():
            if same and ev.node_id in member.started:
                return None
            started = sorted({*member.started, ev.node_id}) if same else [ev.node_id]
            nodes = sorted({*member.nodes, ev.node_id}) if same else [ev.node_id]
            changed = msgspec.structs.replace(member, allocation_id=ev.allocation_id, nodes=nodes, started=started)
            changed = _moved(changed, up if len(started) >= member.hosts else down, now)
    return None if changed == member else changed


def _moved(member: M, to: str, now: dt.datetime) -> M:
    """In state `to`, since `now` if it just entered it."""
    if member.state == to:
        return member
    return msgspec.structs.replace(member, state=to, since=now)
