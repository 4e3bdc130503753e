"""A job's life (`lifecycle.decide`): every transition, table by table, without a database."""

from __future__ import annotations

import datetime as dt

import msgspec
import pytest

from ibpool_core.sched import lifecycle, records
from ibpool_core.sched.lifecycle import LifecycleConfig, Transition, decide
from ibpool_core.sched.records import JobPlacement, JobRecord
from ibpool_proto import encode
from ibpool_proto.health import RequeueRequested
from ibpool_proto.job import CancelJob, JobExited, JobFinished, JobPreempted, JobRequeued, JobScheduled, JobStarted
from ibpool_proto.pool import (
    AllocationExpired,
    AllocationGranted,
    AllocationRejected,
    AllocationRevoked,
    Enforcement,
    GpuAssignment,
    ReleaseAllocation,
)

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
NOW = T0 + dt.timedelta(seconds=30)
CFG = LifecycleConfig(source="scheduler/test", max_attempts=2, retry_after_s=5.0)


def gpus(*nodes: str) -> list[GpuAssignment]:
    return [GpuAssignment(node_id=n, gpu_index=i) for n in nodes for i in range(2)]


def queued(**kw: object) -> JobRecord:
    base = {"job_id": "j", "tenant": "t", "queue": "q", "gpus_per_host": 2, "submitted_at": T0, "queued_at": T0}
    return JobRecord(**(base | kw))  # type: ignore[arg-type]


def proposed(*nodes: str, **kw: object) -> JobRecord:
    return records.proposed(queued(hosts=len(nodes), **kw), "a1", gpus(*nodes), 3, JobPlacement(ranks=list(nodes)))


def held(*nodes: str, state: str = "running", **kw: object) -> JobRecord:
    job = records.granted(proposed(*nodes, **kw), "a1", list(nodes), T0)
    return msgspec.structs.replace(job, state=state, started_at=T0 if state == "running" else None)  # type: ignore[arg-type]


def replace_gang(*nodes: str) -> JobRecord:
    return held(*nodes, on_member_failure="replace")


def granted_news(allocation_id: str = "a1", **kw: object) -> AllocationGranted:
    base = {
        "source": "pool",
        "key": "n1",
        "allocation_id": allocation_id,
        "job_id": "j",
        "node_id": "n1",
        "kind": "gang",
        "assignments": gpus("n1"),
        "enforcement": Enforcement(),
        "lease_expires_at": T0 + dt.timedelta(hours=1),
        "ledger_version": 7,
        "nodes": ["n1", "n2"],
    }
    return AllocationGranted(**(base | kw))  # type: ignore[arg-type]


def exited(node: str, reason: str = "completed", allocation_id: str = "a1") -> JobExited:
    return JobExited(
        source="agent", key="j", job_id="j", allocation_id=allocation_id, node_id=node, exit_code=0, reason=reason
    )  # type: ignore[arg-type]


def revoked(node: str = "n2", allocation_id: str = "a1") -> AllocationRevoked:
    return AllocationRevoked(
        source="pool",
        key=node,
        allocation_id=allocation_id,
        job_id="j",
        node_id=node,
        reason="node failed",
        ledger_version=7,
    )


def rejected(command_id: str, reason: str) -> AllocationRejected:
    return AllocationRejected(
        source="pool", key="j", command_id=command_id, job_id="j", reason=reason, detail="why", ledger_version=7
    )  # type: ignore[arg-type]


def kinds(t: Transition) -> list[str]:
    return [type(e).__name__ for e in t.events]


@pytest.mark.parametrize(
    ("name", "job", "news", "state", "events", "wake"),
    [
        (
            "cancel a queued job",
            queued(),
            CancelJob(source="u", key="j", job_id="j"),
            "cancelled",
            ["JobFinished"],
            True,
        ),
        (
            "cancel a running job: its allocation released",
            held("n1"),
            CancelJob(source="u", key="j", job_id="j"),
            "cancelled",
            ["ReleaseAllocation", "JobFinished"],
            True,
        ),
        ("its proposal granted", proposed("n1", "n2"), granted_news(), "scheduled", ["JobScheduled"], False),
        (
            "an agent's start before the grant's news: granted, then running",
            proposed("n1"),
            JobStarted(source="agent", key="j", job_id="j", allocation_id="a1", node_id="n1", launcher="sim"),
            "running",
            ["JobScheduled"],
            False,
        ),
        ("refused for a conflict: queued at once", proposed("n1"), rejected("a1", "conflict"), "queued", [], True),
        (
            "the last member completed",
            held("n1"),
            exited("n1"),
            "completed",
            ["JobFinished", "ReleaseAllocation"],
            True,
        ),
        (
            "a member failed",
            held("n1", "n2"),
            exited("n2", "failed"),
            "failed",
            ["JobFinished", "ReleaseAllocation"],
            True,
        ),
        ("revoked: requeued", held("n1"), revoked("n1"), "queued", ["ReleaseAllocation", "JobRequeued"], True),
        (
            "lease expired: requeued",
            held("n1"),
            AllocationExpired(source="pool", key="n1", allocation_id="a1", job_id="j", node_id="n1", ledger_version=7),
            "queued",
            ["ReleaseAllocation", "JobRequeued"],
            True,
        ),
        (
            "requeued too often: failed",
            held("n1", attempt=2),
            revoked("n1"),
            "failed",
            ["ReleaseAllocation", "JobFinished"],
            False,
        ),
        (
            "a replaceable gang's member revoked: marked for replacement, nothing released",
            replace_gang("n1", "n2", "n3"),
            revoked("n2"),
            "running",
            [],
            True,
        ),
        (
            "a replaceable gang loses rank 0: restarted",
            replace_gang("n1", "n2", "n3"),
            revoked("n1"),
            "queued",
            ["ReleaseAllocation", "JobRequeued"],
            True,
        ),
        (
            "a replaceable gang's member exits for its hardware: replaced",
            replace_gang("n1", "n2", "n3"),
            exited("n3", "xid"),
            "running",
            [],
            True,
        ),
    ],
)
def test_each_transition(
    name: str, job: JobRecord, news: lifecycle.News, state: str, events: list[str], wake: bool
) -> None:
    t = decide(job, news, NOW, CFG)
    assert t.job is not None, name
    assert (t.job.state, kinds(t), t.wake) == (state, events, wake), name


@pytest.mark.parametrize(
    ("name", "job", "news"),
    [
        ("no such job", None, CancelJob(source="u", key="j", job_id="j")),
        (
            "cancel an ended job",
            records.finished(queued(), "completed", "done", T0),
            CancelJob(source="u", key="j", job_id="j"),
        ),
        ("a grant answered already (another member's)", held("n1", "n2"), granted_news()),
        ("another proposal's refusal", proposed("n1"), rejected("a-old", "conflict")),
        ("a revoked member's exit: the revocation requeues it", held("n1"), exited("n1", "revoked")),
        ("news of another allocation", held("n1"), revoked("n1", allocation_id="a-old")),
        (
            "a start of a queued job",
            queued(),
            JobStarted(source="a", key="j", job_id="j", allocation_id="a1", node_id="n1", launcher="sim"),
        ),
        # News of a job from a node it does not hold is no news of that job.
        ("an exit from a node the job does not hold", held("n1"), exited("n9", "failed")),
        (
            "a start from a node the job does not hold",
            held("n1", state="scheduled"),
            JobStarted(source="a", key="j", job_id="j", allocation_id="a1", node_id="n9", launcher="sim"),
        ),
    ],
)
def test_news_that_changes_nothing(name: str, job: JobRecord | None, news: lifecycle.News) -> None:
    t = decide(job, news, NOW, CFG)
    assert (t.job, t.events) == (None, []), name


def test_a_gang_completes_only_when_every_member_did() -> None:
    job = held("n1", "n2")
    one = decide(job, exited("n1"), NOW, CFG)
    assert one.job is not None and one.job.state == "running" and one.job.exited_nodes == ["n1"] and not one.events
    both = decide(one.job, exited("n2"), NOW, CFG)
    assert both.job is not None and both.job.state == "completed"


def test_a_refusal_for_quota_waits_and_says_so() -> None:
    t = decide(proposed("n1"), rejected("a1", "over_quota"), NOW, CFG)
    assert t.job is not None and t.job.state == "queued" and t.job.wait_code == "over_quota"
    assert t.job.not_before == NOW + dt.timedelta(seconds=5) and t.counts == [("answers", "over_quota")]


def test_the_controllers_backoff_goes_with_the_requeue() -> None:
    news = RequeueRequested(
        source="fc", key="j", job_id="j", allocation_id="a1", node_id="n1", reason="xid 79", retry_after_s=60.0
    )
    t = decide(held("n1"), news, NOW, CFG)
    assert t.job is not None and t.job.not_before == NOW + dt.timedelta(seconds=60) and t.job.attempt == 1
    (requeued,) = [e for e in t.events if isinstance(e, JobRequeued)]
    assert requeued.not_before == t.job.not_before and "xid 79" in requeued.reason


def test_a_job_requeued_off_a_failed_node_avoids_it_for_a_while_and_forgets_it_once_granted() -> None:
    news = RequeueRequested(source="fc", key="j", job_id="j", allocation_id="a1", node_id="n1", reason="node failed")
    t = decide(held("n1"), news, NOW, CFG)
    assert t.job is not None and t.job.avoid == ["n1"]
    assert t.job.avoid_until == NOW + dt.timedelta(seconds=CFG.avoid_lost_node_s)
    assert records.avoided(t.job, NOW) == {"n1"}
    assert records.avoided(t.job, t.job.avoid_until) == frozenset()  # the window is over
    revoked_off = decide(held("n2"), revoked("n2"), NOW, CFG).job
    assert revoked_off is not None and revoked_off.avoid == ["n2"]
    lease = AllocationExpired(source="pool", key="n1", allocation_id="a1", job_id="j", node_id="n1", ledger_version=7)
    expired = decide(held("n1"), lease, NOW, CFG)
    assert expired.job is not None and expired.job.avoid == []  # a lost lease names no failed node
    again = records.granted(records.proposed(t.job, "a2", gpus("n2"), 4, None), "a2", ["n2"], NOW)
    assert again.avoid == [] and again.avoid_until is None


def test_a_replaced_member_takes_the_lost_ones_rank_and_a_refusal_is_tried_again_then_restarts() -> None:
    marked = decide(replace_gang("n1", "n2", "n3"), revoked("n2"), NOW, CFG).job
    assert marked is not None and marked.replacing == "n2" and marked.replace_id is None
    proposed_again = msgspec.structs.replace(marked, replace_id="r1", replace_proposal=gpus("n9"))
    # a second member lost while one is being replaced: the gang restarts
    second = decide(proposed_again, revoked("n3"), NOW, CFG)
    assert second.job is not None and second.job.state == "queued"
    # the replacement granted: n9 is rank 1 now
    grant = granted_news(node_id="n9", assignments=gpus("n9"), replaces="n2", command_id="r1", nodes=["n1", "n9", "n3"])
    done = decide(proposed_again, grant, NOW, CFG).job
    assert done is not None and done.nodes == ["n1", "n9", "n3"] and done.replacements == 1 and done.replacing is None
    assert done.placement is not None and done.placement.ranks == ["n1", "n9", "n3"]
    # refused for a conflict: tried again at once; for anything else: restarted
    again = decide(proposed_again, rejected("r1", "conflict"), NOW, CFG).job
    assert again is not None and again.replace_id is None and again.replace_retries == 1 and again.state == "running"
    given_up = decide(proposed_again, rejected("r1", "invalid"), NOW, CFG)
    assert given_up.job is not None and given_up.job.state == "queued"
    assert "refused (invalid: why): gang restarted" in given_up.job.reason


def test_the_cycles_own_transitions() -> None:
    pre = lifecycle.preempt(held("n1"), "urgent", NOW, CFG)
    assert pre.job is not None and pre.job.state == "queued" and pre.job.reason == "preempted for urgent"
    assert kinds(pre) == ["JobPreempted", "ReleaseAllocation", "JobRequeued"]
    assert isinstance(pre.events[0], JobPreempted) and pre.events[0].for_job_id == "urgent"
    killed = lifecycle.kill(held("n1", time_limit_s=10.0), NOW, CFG)
    assert (
        killed.job is not None
        and killed.job.state == "killed"
        and kinds(killed) == ["ReleaseAllocation", "JobFinished"]
    )
    restarted = lifecycle.restart(replace_gang("n1", "n2"), "no host fits", NOW, CFG)
    assert restarted.job is not None and restarted.job.state == "queued"


def test_the_same_news_at_the_same_time_gives_the_same_bytes() -> None:
    job, news = held("n1", "n2"), revoked("n1")
    a, b = decide(job, news, NOW, CFG), decide(job, news, NOW, CFG)
    assert [encode(e) for e in a.events] == [encode(e) for e in b.events]
    assert a.job == b.job
    releases = [e for e in a.events if isinstance(e, ReleaseAllocation)]
    assert [r.id for r in releases] == [lifecycle.release_id("a1")]
    other = decide(job, msgspec.structs.replace(news, id="another"), NOW, CFG)
    assert [e.id for e in other.events if not isinstance(e, ReleaseAllocation)] != [
        e.id for e in a.events if not isinstance(e, ReleaseAllocation)
    ]
    finished = decide(held("n1"), exited("n1"), NOW, CFG)
    assert any(isinstance(e, JobFinished) for e in finished.events)
    scheduled = decide(proposed("n1"), granted_news(nodes=["n1"]), NOW, CFG)
    (ev,) = scheduled.events
    assert isinstance(ev, JobScheduled) and ev.waited_s == 30.0 and ev.scheduler_term == 3
