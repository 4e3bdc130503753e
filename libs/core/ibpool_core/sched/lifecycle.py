"""A job's life as one pure function: `decide(job, news, now, config) -> Transition`.

The scheduler service's handlers only lock the job's row, call this, save what it returns and put
its events in the outbox; every rule of a job's life is here, table-tested without a database:

    CancelJob              a live job ends `cancelled`, its allocation released
    AllocationGranted      its proposal granted: `scheduled` (JobScheduled); a grant the job does
                           not want (cancelled meanwhile, placed by another proposal) is released;
                           a replaced gang member's grant (`replaces`) takes the lost member's rank
    AllocationRejected     back to the queue in its place: at once for conflict/stale, after
                           `retry_after_s` otherwise (`wait_code` over_quota for quota); a refused
                           member replacement is tried again at once a few times, then the gang restarts
    JobStarted             `running` (an agent's news of a proposal still marked proposed means it
                           was granted: `scheduled` first); news of a node the job does not hold is
                           ignored, here and for JobExited
    JobExited              a gang completes when every member exited `completed`, fails at the
                           first member that exited otherwise; `revoked` changes nothing (the
                           revocation requeues it); a replaceable gang's hardware exit replaces the member
    AllocationRevoked,     the allocation is gone or must go: requeued in its place (`attempt` + 1,
    AllocationExpired,     `not_before` the controller's backoff), `failed` after `max_attempts`; a
    RequeueRequested       gang that declared `replace` and lost one member (not rank 0, not a second
                           one, not past `max_attempts` replacements) has that member replaced instead

Ids of the events are derived from the news (`ibpool_core.ids.event_id`), releases have the one id
of their allocation's release (`release_id`): the same news at the same time gives the same bytes.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal, TypedDict

import msgspec

from ibpool_proto.health import RequeueRequested
from ibpool_proto.job import (
    CancelJob,
    JobExited,
    JobFinished,
    JobPreempted,
    JobRequeued,
    JobScheduled,
    JobStarted,
)
from ibpool_proto.message import Message
from ibpool_proto.pool import (
    AllocationExpired,
    AllocationGranted,
    AllocationRejected,
    AllocationRevoked,
    ReleaseAllocation,
)

from ..ids import event_id
from . import records
from .records import JobPlacement, JobRecord
from .waits import WaitCode

# Allocator refusals answered by placing again at once (the pool moved under the proposal).
RETRY_AT_ONCE = ("conflict", "stale")
# Exit reasons of a member that mean its hardware, not its program, failed: the member is replaced.
HARDWARE_EXITS = ("xid", "lost")
# A replacement refused for `conflict` or `stale` is tried again at once this many times, then the gang restarts.
MAX_REPLACE_RETRIES = 3

News = (
    CancelJob
    | JobStarted
    | JobExited
    | AllocationGranted
    | AllocationRejected
    | AllocationRevoked
    | AllocationExpired
    | RequeueRequested
)
Count = Literal["answers", "requeues"]


class _Envelope(TypedDict):
    id: str
    occurred_at: dt.datetime
    source: str
    key: str


class LifecycleConfig(msgspec.Struct, frozen=True, kw_only=True):
    """source: the events' source (the service instance); max_attempts: requeues (and member
    replacements) before a job ends `failed`; retry_after_s: the wait after a refusal other than
    conflict/stale."""

    source: str
    max_attempts: int = 10
    retry_after_s: float = 5.0
    # A job requeued off a node that failed is not placed there again for this long (`JobRecord.avoid`).
    avoid_lost_node_s: float = 30.0


class Transition(msgspec.Struct, frozen=True, kw_only=True):
    """What to do with one piece of news: `job` the record to save (None: unchanged), `events` for
    the outbox in this order, `counts` the metrics to add ((counter, label)), `wake` whether the next
    cycle should run once this commits, `note` a line for the log (empty: nothing to say)."""

    job: JobRecord | None = None
    events: list[Message] = []
    counts: list[tuple[Count, str]] = []
    wake: bool = False
    note: str = ""


NOTHING = Transition()


def release_id(allocation_id: str) -> str:
    """One id for every release of an allocation: the outbox and JetStream keep one of them."""
    return f"{allocation_id}-release"


def replaceable(job: JobRecord) -> bool:
    """A gang that declared `on_member_failure: replace`."""
    return job.on_member_failure == "replace" and job.hosts > 1


class _Step:
    """One decision in progress: the record as changed so far and what it emitted; `cause` names
    what it answers (the news, or the cycle's finding), from which the events' ids derive."""

    def __init__(self, job: JobRecord, cause: str, now: dt.datetime, config: LifecycleConfig) -> None:
        self.job = job
        self.changed = False
        self.cause = cause
        self.now = now
        self.cfg = config
        self.events: list[Message] = []
        self.counts: list[tuple[Count, str]] = []
        self.wake = False
        self.note = ""

    def save(self, job: JobRecord) -> None:
        self.job, self.changed = job, True

    def emit(self, event: Message) -> None:
        self.events.append(event)

    def envelope(self, key: str) -> _Envelope:
        return {
            "id": event_id(self.now, self.cause, len(self.events)),
            "occurred_at": self.now,
            "source": self.cfg.source,
            "key": key,
        }

    def release(self, allocation_id: str, why: str) -> None:
        self.emit(
            ReleaseAllocation(
                id=release_id(allocation_id),
                occurred_at=self.now,
                source=self.cfg.source,
                key=allocation_id,
                allocation_id=allocation_id,
                reason=why,
            )
        )

    def finished(self, job: JobRecord) -> None:
        assert job.state in ("completed", "failed", "cancelled", "killed")
        self.emit(
            JobFinished(
                **self.envelope(job.job_id),
                job_id=job.job_id,
                state=job.state,
                reason=job.reason,
                allocation_id=job.allocation_id,
                exit_code=job.exit_code,
                runtime_s=job.runtime_s,
                attempt=job.attempt,
            )
        )

    def done(self) -> Transition:
        return Transition(
            job=self.job if self.changed else None,
            events=self.events,
            counts=self.counts,
            wake=self.wake,
            note=self.note,
        )


def decide(job: JobRecord | None, news: News, now: dt.datetime, config: LifecycleConfig) -> Transition:
    """What `news` does to `job` (its record as stored, None when the scheduler has no such job); see
    the module docstring. Pure: the same input gives the same transition, event ids included."""
    if job is None:
        return NOTHING
    step = _Step(job, f"{news.id}/{type(news).__name__}", now, config)
    match news:
        case CancelJob():
            _cancel(step, news.reason)
        case JobStarted():
            _started(step, news)
        case JobExited():
            _exited(step, news)
        case AllocationGranted():
            _granted(step, news)
        case AllocationRejected():
            _rejected(step, news)
        case AllocationRevoked():
            _lost(step, news.allocation_id, f"allocation revoked: {news.reason}", node_id=news.node_id)
        case AllocationExpired():
            _lost(step, news.allocation_id, "allocation lease expired")
        case RequeueRequested():
            later = now + dt.timedelta(seconds=news.retry_after_s) if news.retry_after_s > 0 else None
            _lost(step, news.allocation_id, f"requeue requested: {news.reason}", later, news.node_id)
    return step.done()


def restart(job: JobRecord, why: str, now: dt.datetime, config: LifecycleConfig) -> Transition:
    """The cycle found that a held gang cannot go on (no host fits its lost member's replacement):
    released and requeued in its place, or failed after `max_attempts`."""
    step = _Step(job, f"{job.job_id}/{job.allocation_id}/restart/{job.attempt}", now, config)
    if job.holding and job.allocation_id is not None:
        _requeue(step, why)
    return step.done()


def preempt(job: JobRecord, for_job_id: str, now: dt.datetime, config: LifecycleConfig) -> Transition:
    """The cycle preempts held `job` for `for_job_id`: JobPreempted, its allocation released, requeued."""
    assert job.allocation_id is not None
    step = _Step(job, f"{job.job_id}/{job.allocation_id}/preempted", now, config)
    again = records.requeued(job, f"preempted for {for_job_id}", now, None)
    step.save(again)
    step.emit(
        JobPreempted(
            **step.envelope(job.job_id),
            job_id=job.job_id,
            allocation_id=job.allocation_id,
            for_job_id=for_job_id,
            reason=f"priority: {for_job_id} ranks before it",
        )
    )
    step.release(job.allocation_id, f"job {job.job_id} preempted for {for_job_id}")
    step.emit(
        JobRequeued(
            **step.envelope(job.job_id),
            job_id=job.job_id,
            allocation_id=job.allocation_id,
            reason=f"preempted for {for_job_id}",
            attempt=again.attempt,
        )
    )
    return step.done()


def kill(job: JobRecord, now: dt.datetime, config: LifecycleConfig) -> Transition:
    """The cycle kills `job`, past its time limit: released, ended `killed`."""
    step = _Step(job, f"{job.job_id}/{job.allocation_id}/killed", now, config)
    done = records.finished(job, "killed", f"ran past its time limit of {job.time_limit_s} s", now)
    step.save(done)
    if job.allocation_id is not None:
        step.release(job.allocation_id, f"job {job.job_id} overran its time limit")
    step.finished(done)
    return step.done()


# -- the rules ------------------------------------------------------------------------------------


def _cancel(step: _Step, reason: str) -> None:
    job = step.job
    if not job.live:
        return
    if job.holding and job.allocation_id is not None:
        step.release(job.allocation_id, f"job {job.job_id} cancelled")
    done = records.finished(job, "cancelled", reason, step.now)
    step.save(done)
    step.finished(done)
    step.wake = True


def _mark_granted(step: _Step, allocation_id: str, nodes: list[str]) -> None:
    job = step.job
    step.counts.append(("answers", "granted"))
    done = records.granted(job, allocation_id, nodes, step.now)
    step.save(done)
    step.emit(
        JobScheduled(
            **step.envelope(job.job_id),
            job_id=job.job_id,
            allocation_id=allocation_id,
            tenant=job.tenant,
            queue=job.queue,
            nodes=done.nodes,
            assignments=done.assignments,
            waited_s=max(0.0, (step.now - job.queued_at).total_seconds()),
            attempt=job.attempt,
            scheduler_term=job.proposal_term,
        )
    )


def _current(step: _Step, allocation_id: str) -> bool:
    """Whether `allocation_id` is the job's allocation (an agent's news of a proposal still marked
    proposed means it was granted: the grant's own news comes through another consumer, maybe later)."""
    job = step.job
    if job.state == "proposed" and job.proposal_id == allocation_id:
        _mark_granted(step, allocation_id, sorted({a.node_id for a in job.proposal}))
        return True
    return job.holding and job.allocation_id == allocation_id


def _started(step: _Step, ev: JobStarted) -> None:
    if not _current(step, ev.allocation_id) or step.job.state != "scheduled" or ev.node_id not in step.job.nodes:
        return  # not current, or news from a node the job does not hold
    step.save(msgspec.structs.replace(step.job, state="running", started_at=ev.occurred_at))


def _exited(step: _Step, ev: JobExited) -> None:
    if ev.reason == "revoked" or not _current(step, ev.allocation_id):
        return  # not ours, not current, or revoked (the revocation requeues it)
    job = step.job
    if ev.node_id not in job.nodes:
        return  # a node the job does not hold (a member replaced already): its end is not the job's
    if replaceable(job):
        if ev.reason in HARDWARE_EXITS:
            detail = f"{ev.reason} on {ev.node_id}: {ev.detail}".rstrip(": ")
            _member_lost(step, ev.node_id, f"member exited ({detail})", None)
            return
    exited = sorted({*job.exited_nodes, ev.node_id})
    if ev.reason == "completed" and len(exited) < len(job.nodes):
        step.save(msgspec.structs.replace(job, exited_nodes=exited))
        return  # a gang is done when all its members are
    started = job.started_at or job.scheduled_at or step.now
    runtime = ev.runtime_s or (step.now - started).total_seconds()
    completed = ev.reason == "completed"
    why = "completed" if completed else f"{ev.reason} on {ev.node_id}: {ev.detail}".rstrip(": ")
    done = records.finished(job, "completed" if completed else "failed", why, step.now, ev.exit_code, runtime)
    done = msgspec.structs.replace(done, exited_nodes=exited)
    step.save(done)
    step.finished(done)
    step.release(ev.allocation_id, f"job {job.job_id} exited")
    step.wake = True


def _granted(step: _Step, ev: AllocationGranted) -> None:
    job = step.job
    if ev.replaces is not None:
        _member_granted(step, ev)
        return
    if job.allocation_id == ev.allocation_id:
        return  # another member of a gang already granted
    if job.state == "proposed" and job.proposal_id == ev.allocation_id:
        _mark_granted(step, ev.allocation_id, list(ev.nodes) or [ev.node_id])
        return
    # A grant the job no longer wants (cancelled meanwhile, or placed by another proposal): give it back.
    step.note = f"stray grant released (job {job.state})"
    step.release(ev.allocation_id, f"job {job.job_id} does not hold allocation {ev.allocation_id}")


def _rejected(step: _Step, ev: AllocationRejected) -> None:
    job = step.job
    if job.replace_id is not None and job.replace_id == ev.command_id:
        _replacement_refused(step, ev)
        return
    if job.state != "proposed" or job.proposal_id != ev.command_id:
        return
    step.counts.append(("answers", ev.reason))
    # conflict/stale: the pool moved under the proposal; place it again on fresher state at once.
    later = None if ev.reason in RETRY_AT_ONCE else step.now + dt.timedelta(seconds=step.cfg.retry_after_s)
    why = f"proposal rejected ({ev.reason}): {ev.detail}"
    code: WaitCode | None = "over_quota" if ev.reason == "over_quota" else None
    step.save(msgspec.structs.replace(records.rejected(job, why, later), wait_code=code))
    step.wake = True


def _lost(
    step: _Step,
    allocation_id: str,
    why: str,
    not_before: dt.datetime | None = None,
    node_id: str | None = None,
) -> None:
    """The job's allocation is gone or must go: requeue it in its place (or fail it after
    max_attempts); a replaceable gang's lost member on `node_id` is replaced instead."""
    job = step.job
    if not job.holding or job.allocation_id != allocation_id:
        return
    if node_id is not None and replaceable(job):
        _member_lost(step, node_id, why, not_before)
        return
    _requeue(step, why, not_before, node_id)


def _requeue(step: _Step, why: str, not_before: dt.datetime | None = None, lost_on: str | None = None) -> None:
    """Release the job's allocation and queue it again (`lost_on`: the node a failure took it from,
    avoided for `avoid_lost_node_s`), or fail it past `max_attempts`."""
    job = step.job
    assert job.allocation_id is not None
    allocation_id = job.allocation_id
    step.counts.append(("requeues", why.split(":", 1)[0]))
    step.release(allocation_id, f"job {job.job_id} requeued")
    if job.attempt + 1 > step.cfg.max_attempts:
        done = records.finished(job, "failed", f"requeued {job.attempt} times; then {why}", step.now)
        step.save(done)
        step.finished(done)
        return
    avoid = None if lost_on is None else (lost_on, step.now + dt.timedelta(seconds=step.cfg.avoid_lost_node_s))
    again = records.requeued(job, why, step.now, not_before, avoid)
    step.save(again)
    step.emit(
        JobRequeued(
            **step.envelope(job.job_id),
            job_id=job.job_id,
            allocation_id=allocation_id,
            reason=why,
            attempt=again.attempt,
            not_before=not_before,
        )
    )
    step.wake = True


# -- a gang that replaces a lost member -------------------------------------------------------------


def replacing_reason(node_id: str, not_before: dt.datetime | None, why: str) -> str:
    """The reason of a job whose member on `node_id` is to be replaced (ReplaceGangMember carries it)."""
    after = f" not before {not_before.isoformat(timespec='seconds')}" if not_before is not None else ""
    return f"replacing the member on {node_id}{after}: {why}"


def _later(a: dt.datetime | None, b: dt.datetime | None) -> bool:
    return a is not None and (b is None or a > b)


def _member_lost(step: _Step, node_id: str, why: str, not_before: dt.datetime | None) -> None:
    """A replaceable gang lost its member on `node_id`: mark it for replacement, proposed not before
    `not_before` (the failover controller's backoff), or restart the gang (a second member lost, rank
    0, too many replacements)."""
    job = step.job
    if job.replacing == node_id and job.replace_id is None and _later(not_before, job.not_before):
        # The controller's backoff came after the revocation that marked the member: wait for it too.
        step.save(
            msgspec.structs.replace(job, not_before=not_before, reason=replacing_reason(node_id, not_before, why))
        )
        return
    if node_id not in job.nodes or job.replacing == node_id:
        return  # a member replaced already (the old member's late news), or being replaced
    if job.replacing is not None:
        lost = f"member on {node_id} lost while the member on {job.replacing} was being replaced"
        _requeue(step, f"{lost}: gang restarted; {why}", not_before, node_id)
        return
    ranked = job.placement.ranks if job.placement is not None and job.placement.ranks else job.nodes
    if ranked and node_id == ranked[0]:
        # Rank 0 is the gang's rendezvous (MASTER_ADDR in every member's environment): the survivors
        # would keep pointing at the lost host, so the whole gang starts again.
        _requeue(step, f"member of rank 0 on {node_id} lost: gang restarted; {why}", not_before, node_id)
        return
    if job.replacements >= step.cfg.max_attempts:
        _requeue(step, f"{job.replacements} members replaced already: gang restarted; {why}", not_before, node_id)
        return
    step.save(
        msgspec.structs.replace(
            job,
            replacing=node_id,
            replace_id=None,
            replace_proposal=[],
            replace_retries=0,
            exited_nodes=[n for n in job.exited_nodes if n != node_id],
            not_before=not_before,
            reason=replacing_reason(node_id, not_before, why),
        )
    )
    step.counts.append(("requeues", "member replacement"))
    step.note = f"gang member on {node_id} lost; replacing it: {why}"
    step.wake = True


def _member_granted(step: _Step, ev: AllocationGranted) -> None:
    """The grant of a replaced member (`ev.replaces`): the new host takes the lost one's rank."""
    job = step.job
    if not (job.holding and job.allocation_id == ev.allocation_id):
        # Not the job's allocation any more (it restarted meanwhile): give the allocation back.
        step.release(ev.allocation_id, f"job {job.job_id} does not hold allocation {ev.allocation_id}")
        return
    if job.replace_id != ev.command_id or job.replacing != ev.replaces:
        return  # a repeated grant, answered already
    lost, new = ev.replaces, ev.node_id
    nodes = list(ev.nodes) or [new if n == lost else n for n in job.nodes]
    rank = {n: i for i, n in enumerate(nodes)}
    assignments = sorted(
        [*(a for a in job.assignments if a.node_id != lost), *ev.assignments],
        key=lambda a: (rank.get(a.node_id, len(rank)), a.gpu_index),
    )
    placement = job.placement
    if placement is not None:
        placement = msgspec.structs.replace(placement, ranks=[new if h == lost else h for h in placement.ranks])
    step.save(
        msgspec.structs.replace(
            job,
            nodes=nodes,
            assignments=assignments,
            placement=placement or JobPlacement(ranks=nodes),
            replacing=None,
            replace_id=None,
            replace_proposal=[],
            replace_retries=0,
            replacements=job.replacements + 1,
            not_before=None,
            exited_nodes=[n for n in job.exited_nodes if n != lost],
            reason=f"member on {lost} replaced by {new}",
        )
    )
    step.counts.append(("answers", "member replaced"))
    step.note = f"gang member on {lost} replaced by {new}"


def _replacement_refused(step: _Step, ev: AllocationRejected) -> None:
    """The allocator refused the replacement: try again at once on fresher state (conflict, stale, a
    few times), else restart the gang with the reason."""
    job = step.job
    assert job.allocation_id is not None and job.replacing is not None
    step.counts.append(("answers", f"replacement {ev.reason}"))
    if ev.reason in RETRY_AT_ONCE and job.replace_retries < MAX_REPLACE_RETRIES:
        step.save(
            msgspec.structs.replace(
                job,
                replace_id=None,
                replace_proposal=[],
                replace_retries=job.replace_retries + 1,
                reason=f"replacing the member on {job.replacing}: refused ({ev.reason}: {ev.detail}), trying again",
            )
        )
        step.wake = True
        return
    why = f"replacement of the member on {job.replacing} refused ({ev.reason}: {ev.detail}): gang restarted"
    if job.holding and job.allocation_id is not None:
        _requeue(step, why)
