"""A member job's life (members.after_news), table-driven: replicas and workers alike, on one host or several."""

from __future__ import annotations

import datetime as dt

import pytest

from ibpool_autoscaler.deployments import ReplicaRecord
from ibpool_autoscaler.elastic import WorkerRecord
from ibpool_autoscaler.members import GONE, MemberNews, after_news
from ibpool_proto.job import JobFinished, JobRequeued, JobScheduled, JobStarted

T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
T1 = T0 + dt.timedelta(seconds=5)


def replica(hosts: int = 1, **kw: object) -> ReplicaRecord:
    base: dict[str, object] = {"job_id": "chat-r1", "deployment": "chat", "state": "starting", "since": T0}
    return ReplicaRecord(**{**base, "submitted_at": T0, "hosts": hosts, **kw})  # type: ignore[arg-type]


def scheduled(alloc: str, *nodes: str) -> JobScheduled:
    return JobScheduled(
        source="s", key="chat-r1", job_id="chat-r1", allocation_id=alloc, tenant="t", queue="q", nodes=list(nodes)
    )


def started(alloc: str, node: str) -> JobStarted:
    return JobStarted(source="a", key="chat-r1", job_id="chat-r1", allocation_id=alloc, node_id=node, launcher="sim")


def requeued(alloc: str) -> JobRequeued:
    return JobRequeued(source="s", key="chat-r1", job_id="chat-r1", allocation_id=alloc, reason="node failed")


def run(member: ReplicaRecord, *news: MemberNews) -> ReplicaRecord | str | None:
    out: ReplicaRecord | str | None = member
    for ev in news:
        assert isinstance(out, ReplicaRecord)
        nxt = after_news(out, ev, T1)
        out = out if nxt is None else nxt
    return out


# (case, hosts, news, state, started, nodes)
CASES: list[tuple[str, int, list[MemberNews], str, list[str], list[str]]] = [
    ("one host: scheduled, started -> ready", 1, [scheduled("a1", "n1"), started("a1", "n1")], "ready", ["n1"], ["n1"]),
    ("one host: started before scheduled -> ready", 1, [started("a1", "n1"), scheduled("a1", "n1")], "ready", ["n1"],
     ["n1"]),
    ("two hosts: one member started -> still starting", 2, [scheduled("a1", "n1", "n2"), started("a1", "n2")],
     "starting", ["n2"], ["n1", "n2"]),
    ("two hosts: both started -> ready", 2, [scheduled("a1", "n2", "n1"), started("a1", "n2"), started("a1", "n1")],
     "ready", ["n1", "n2"], ["n1", "n2"]),
    ("two hosts: both started before scheduled -> ready", 2,
     [started("a1", "n1"), started("a1", "n2"), scheduled("a1", "n1", "n2")], "ready", ["n1", "n2"], ["n1", "n2"]),
    ("two hosts: a start twice counts once", 2, [scheduled("a1", "n1", "n2"), started("a1", "n1"), started("a1", "n1")],
     "starting", ["n1"], ["n1", "n2"]),
    ("ready, requeued -> starting, nothing started", 2,
     [scheduled("a1", "n1", "n2"), started("a1", "n1"), started("a1", "n2"), requeued("a1")], "starting", [], []),
    ("requeue of an old allocation changes nothing", 1, [scheduled("a2", "n1"), started("a2", "n1"), requeued("a1")],
     "ready", ["n1"], ["n1"]),
    ("placed again after a requeue: the old starts do not count", 2,
     [scheduled("a1", "n1", "n2"), started("a1", "n1"), requeued("a1"), scheduled("a2", "n3", "n4"),
      started("a2", "n3")], "starting", ["n3"], ["n3", "n4"]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "hosts", "news", "state", "started", "nodes"), CASES, ids=[c[0] for c in CASES])
def test_member_news(
    case: str, hosts: int, news: list[MemberNews], state: str, started: list[str], nodes: list[str]
) -> None:
    out = run(replica(hosts), *news)
    assert isinstance(out, ReplicaRecord)
    assert (out.state, out.started, out.nodes) == (state, started, nodes)
    if state == "ready":
        assert out.since == T1


def test_news_that_changes_nothing_is_none_and_a_finished_job_is_gone() -> None:
    ready = run(replica(1), scheduled("a1", "n1"), started("a1", "n1"))
    assert isinstance(ready, ReplicaRecord)
    assert after_news(ready, started("a1", "n1"), T1) is None
    done = JobFinished(source="s", key="chat-r1", job_id="chat-r1", state="failed", reason="exit 1")
    assert after_news(ready, done, T1) == GONE


def test_a_worker_moves_between_queued_and_running() -> None:
    w = WorkerRecord(job_id="ft-w1", elastic_job="ft", state="queued", since=T0, submitted_at=T0)
    up = after_news(w, started("a1", "n1"), T1)
    assert isinstance(up, WorkerRecord) and (up.state, up.since) == ("running", T1)
    down = after_news(up, requeued("a1"), T1)
    assert isinstance(down, WorkerRecord) and down.state == "queued"
