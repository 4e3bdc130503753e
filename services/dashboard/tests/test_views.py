"""The dashboard's page models from the services' answers, without any service."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from ibpool_dashboard import views
from ibpool_dashboard.feed import STATE_MESSAGES, event_subjects

NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)


def gpu(index: int, granted: int, holders: list[str], state: str = "ready") -> dict[str, Any]:
    return {
        "index": index,
        "model": "H100",
        "state": state,
        "granted_milli": granted,
        "free_milli": 1000 - granted,
        "memory_mib": 81559,
        "holders": holders,
    }


POOL = {
    "models": [{"model": "H100", "capacity_milli": 4000, "allocated_milli": 1750}],
    "fabric": {"name": "rail-optimised-2"},
    "nodes": [
        {
            "node_id": "n2",
            "state": "ready",
            "free_milli": 1000,
            "gpus": [gpu(0, 1000, ["a1"]), gpu(1, 0, [], state="cordoned")],
        },
        {"node_id": "n1", "state": "ready", "free_milli": 1250, "gpus": [gpu(0, 750, ["a2", "a3"]), gpu(1, 0, [])]},
    ],
}
ALLOCATIONS = [
    {
        "allocation_id": "a1",
        "owner": "train",
        "grants": [{"node_id": "n2", "gpu_index": 0, "milli": 1000, "mig": None}],
    },
    {"allocation_id": "a2", "owner": "infer", "grants": [{"node_id": "n1", "gpu_index": 0, "milli": 500, "mig": None}]},
    {
        "allocation_id": "a3",
        "owner": "tiny",
        "grants": [{"node_id": "n1", "gpu_index": 0, "milli": 250, "mig": {"profile": "1g.10gb"}}],
    },
]
HEALTH = [
    {"node_id": "n1", "status": "healthy", "gpus": [], "cordoned": False, "operator_drain": "", "last_beat": None},
    {
        "node_id": "n2",
        "status": "failed",
        "reason": "heartbeats missing",
        "gpus": [{"index": 0, "failed": True, "cordoned": False}],
        "cordoned": True,
        "operator_drain": "fan",
        "last_beat": "2026-12-05T11:59:00+00:00",
    },
]
TELEMETRY = {"n1": {"gpus": [{"index": 0, "utilization_pct": 80.0, "temperature_c": 61.0, "memory_used_mib": 100}]}}


def job(job_id: str, state: str, **more: Any) -> dict[str, Any]:
    return {"job_id": job_id, "tenant": "t", "queue": "q", "state": state, "milli": 1000, "gpus": 1, "hosts": 1} | more


def test_gpu_grid_shows_each_gpu_with_its_jobs_slices_state_and_telemetry() -> None:
    grid = views.gpu_grid(POOL, ALLOCATIONS, HEALTH, TELEMETRY)
    assert [n.node_id for n in grid.nodes] == ["n1", "n2"]
    n1, n2 = grid.nodes
    shared = n1.gpus[0]
    assert shared.state == "shared" and shared.utilization_pct == 80.0 and shared.temperature_c == 61.0
    assert [(s.job, s.milli, s.mig) for s in shared.slices] == [("infer", 500, None), ("tiny", 250, "1g.10gb")]
    assert n1.gpus[1].state == "idle" and n1.gpus[1].utilization_pct is None
    assert n2.health == "failed"
    assert n2.gpus[0].state == "failed"  # the failover controller's verdict on a busy GPU
    assert n2.gpus[1].state == "cordoned"  # the pool's own state


def test_overview_counts_gpus_by_state_nodes_by_health_and_jobs_waiting() -> None:
    jobs = [job("a", "queued"), job("b", "proposed"), job("c", "running"), job("d", "scheduled")]
    links = [{"link_id": "x", "state": "up"}, {"link_id": "y", "state": "down"}]
    point = views.history_point(POOL, jobs, 5.0)
    o = views.overview(POOL, HEALTH, jobs, links, TELEMETRY, [point])
    assert o.gpus == 4 and o.gpus_by_state == {"busy": 1, "cordoned": 1, "idle": 1, "shared": 1}
    assert o.allocated_pct == 43.8 and o.mean_utilization_pct == 80.0
    assert o.nodes_by_health == {"failed": 1, "healthy": 1}
    assert (o.queued, o.running, o.links_with_problems, o.fabric) == (2, 2, 1, "rail-optimised-2")
    assert o.history == [views.HistoryPoint(at=5.0, allocated_pct=43.8, queued=2, running=2)]


def test_overview_of_a_cluster_whose_services_did_not_answer_is_empty_not_an_error() -> None:
    o = views.overview(None, [], [], [], {}, [])
    assert (o.gpus, o.allocated_pct, o.mean_utilization_pct, o.fabric) == (0, 0.0, None, "")


def test_queue_orders_waiting_jobs_by_priority_then_wait_and_says_why() -> None:
    jobs = [
        job("late", "queued", priority=0, submitted_at="2026-12-05T11:59:50+00:00", reason="no free GPUs"),
        job("early", "queued", priority=0, submitted_at="2026-12-05T11:50:00+00:00", wait_code="unresolvable"),
        job("urgent", "queued", priority=9, submitted_at="2026-12-05T11:59:59+00:00"),
        job("gang", "running", hosts=2, gpus_per_host=8),
        job("half", "queued", milli=500),
        job("done", "completed"),
    ]
    q = views.queue(jobs, {"queues": [{"queue": "q"}]}, NOW)
    assert [j.job_id for j in q.jobs] == ["urgent", "early", "late", "half"]
    assert q.jobs[1].waited_s == 600.0 and q.jobs[1].wait_code == "unresolvable" and q.jobs[2].reason == "no free GPUs"
    assert q.jobs[3].shape == "0.5 GPU" and q.jobs[3].waited_s is None
    assert [(j.job_id, j.shape) for j in q.running] == [("gang", "2x8")]
    assert q.queues == [{"queue": "q"}]


TOPOLOGY = {
    "name": "two-leaves",
    "hosts": [{"name": "h1"}, {"name": "h2"}],
    "cas": [{"guid": "c1", "host": "h1"}, {"guid": "c2", "host": "h2"}],
    "switches": [
        {"guid": "l1", "name": "leaf1", "radix": 8},
        {"guid": "l2", "name": "leaf2", "radix": 8},
        {"guid": "s1", "name": "spine", "radix": 8, "sharp": True},
    ],
    "links": [
        {"a": ["c1", 1], "b": ["l1", 1]},
        {"a": ["c2", 1], "b": ["l2", 1]},
        {"a": ["l1", 2], "b": ["s1", 1]},
        {"a": ["l1", 3], "b": ["s1", 2]},
        {"a": ["l2", 2], "b": ["s1", 3]},
    ],
}


def test_fabric_draws_tiers_and_parallel_cables_as_one_edge_in_their_worst_health() -> None:
    links = [{"link_id": "l1:3-s1:2", "state": "degraded", "problems": ["symbol_errors"]}]
    f = views.fabric(TOPOLOGY, links)
    assert f.tiers == 2 and [(s.name, s.tier, s.sharp) for s in f.switches] == [
        ("leaf1", 1, False),
        ("leaf2", 1, False),
        ("spine", 2, True),
    ]
    edges = {(e.a, e.b): e for e in f.edges}
    assert set(edges) == {("h1", "l1"), ("h2", "l2"), ("l1", "s1"), ("l2", "s1")}
    trunk = edges[("l1", "s1")]
    assert (trunk.cables, trunk.state, trunk.problems) == (2, "degraded", ["symbol_errors"])
    assert edges[("l2", "s1")].state == "up" and not any(e.highlighted for e in f.edges)


def test_fabric_highlights_a_jobs_hosts_and_their_leaves() -> None:
    f = views.fabric(TOPOLOGY, [], highlight=["h2", "not-in-the-fabric"], job="j")
    assert f.job == "j" and f.highlighted_hosts == ["h2"] and f.highlighted_switches == ["l2"]
    assert [(e.a, e.b) for e in f.edges if e.highlighted] == [("h2", "l2")]


def test_fabric_without_a_topology_is_empty() -> None:
    assert views.fabric(None, []).hosts == []


def test_nodes_join_pool_health_jobs_and_verdict_history() -> None:
    verdicts = [
        {"key": "n2", "type": "NodeFailed", "occurred_at": "t2", "event": {"reason": "heartbeats missing"}},
        {"key": "n2", "type": "NodeSuspected", "occurred_at": "t1", "event": {}},
    ]
    rows = {r.node_id: r for r in views.nodes(POOL, HEALTH, ALLOCATIONS, verdicts).nodes}
    n1, n2 = rows["n1"], rows["n2"]
    assert (n1.health, n1.free_gpus, n1.jobs, n1.history) == ("healthy", 1.25, ["infer", "tiny"], [])
    assert (n2.health, n2.cordoned, n2.drained, n2.jobs) == ("failed", True, "fan", ["train"])
    assert [h["type"] for h in n2.history] == ["NodeFailed", "NodeSuspected"]
    assert n2.history[0]["reason"] == "heartbeats missing"


def test_job_detail_has_its_placement_sharp_and_the_trace_id_its_events_carry() -> None:
    found = job(
        "g",
        "running",
        hosts=2,
        gpus_per_host=8,
        nodes=["n2", "n1"],
        assignments=[{"node_id": "n2", "gpu_index": 0, "milli": 1000}],
        placement={"ranks": ["n1", "n2"], "sharp": True, "sharp_reason": "one leaf", "tier": 1},
    )
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    events = [
        views.event_row(1, "JobQueued", "g", "ibpool.job.job.queued.g", {"job_id": "g"}, None),
        views.event_row(2, "JobScheduled", "g", "ibpool.job.job.scheduled.g", {}, f"00-{trace}-00f067aa0ba902b7-01"),
    ]
    d = views.job_detail(found, events)
    assert (d.shape, d.ranks, d.sharp, d.sharp_reason, d.tier) == ("2x8", ["n1", "n2"], True, "one leaf", 1)
    assert d.trace_id == trace and [e.type for e in d.events] == ["JobQueued", "JobScheduled"]


@pytest.mark.parametrize("header", [None, "", "00-short-00f067aa0ba902b7-01", "garbage"])
def test_a_malformed_traceparent_has_no_trace_id(header: str | None) -> None:
    assert views.trace_id(header) is None


def test_event_row_keeps_the_events_own_fields_only() -> None:
    row = views.event_row(
        7,
        "NodeFailed",
        "n1",
        "ibpool.health.node.failed.n1",
        {"id": "x", "type": "io.ibpool...", "source": "fc/1", "occurred_at": "t", "reason": "r", "schema_version": 1},
    )
    assert (row.seq, row.at, row.source, row.fields) == (7, "t", "fc/1", {"reason": "r"})


def test_the_event_stream_leaves_out_state_that_the_next_message_replaces() -> None:
    subjects = {s for ss in event_subjects().values() for s in ss}
    assert "ibpool.job.job.queued.*" in subjects and "ibpool.health.drain.requested.*" in subjects
    assert not {m.subject_pattern() for m in STATE_MESSAGES} & subjects
