"""The scheduler's job gauges: a summary of the live jobs, and what the collector writes of it."""

from __future__ import annotations

import datetime as dt

from prometheus_client import CollectorRegistry, generate_latest

from ibpool_core.sched.records import JobRecord, JobState
from ibpool_scheduler.job_metrics import JobCounts, JobsCollector, count_jobs

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def job(job_id: str, state: JobState, queue: str = "batch", tenant: str = "a", waited_s: float = 0.0) -> JobRecord:
    at = NOW - dt.timedelta(seconds=waited_s)
    return JobRecord(job_id=job_id, tenant=tenant, queue=queue, submitted_at=at, queued_at=at, state=state)


def test_every_live_state_is_counted_and_zero_states_are_kept() -> None:
    counts = count_jobs([job("1", "queued"), job("2", "running"), job("3", "running")], NOW)
    assert counts.by_state == {"queued": 1, "proposed": 0, "scheduled": 0, "running": 2}


def test_queued_and_proposed_jobs_wait_by_queue_and_tenant() -> None:
    jobs = [
        job("1", "queued", "batch", "a"),
        job("2", "proposed", "batch", "a"),
        job("3", "queued", "batch", "b"),
        job("4", "queued", "interactive", "a"),
        job("5", "scheduled", "batch", "a"),
        job("6", "running", "batch", "c"),
    ]
    assert count_jobs(jobs, NOW).waiting == {("batch", "a"): 2, ("batch", "b"): 1, ("interactive", "a"): 1}


def test_oldest_wait_is_the_longest_waiting_job_of_its_queue_and_zero_when_none_waits() -> None:
    jobs = [
        job("1", "queued", "batch", waited_s=30),
        job("2", "proposed", "batch", waited_s=3600),
        job("3", "running", "batch", waited_s=90_000),  # granted: not waiting
        job("4", "running", "idle"),
    ]
    counts = count_jobs(jobs, NOW, queues=["configured"])
    assert counts.oldest_wait_s == {"batch": 3600.0, "idle": 0.0, "configured": 0.0}


def test_a_job_queued_after_now_has_waited_zero() -> None:
    assert count_jobs([job("1", "queued", waited_s=-5)], NOW).oldest_wait_s == {"batch": 0.0}


def test_the_collector_writes_nothing_while_not_leading() -> None:
    registry = CollectorRegistry()
    registry.register(JobsCollector(lambda: None))
    assert b"ibpool_scheduler" not in generate_latest(registry)


def test_the_collector_writes_the_summary() -> None:
    counts = JobCounts(by_state={"queued": 2, "running": 1}, waiting={("batch", "a"): 2}, oldest_wait_s={"batch": 12.5})
    registry = CollectorRegistry()
    registry.register(JobsCollector(lambda: counts))
    assert registry.get_sample_value("ibpool_scheduler_jobs", {"state": "queued"}) == 2
    assert registry.get_sample_value("ibpool_scheduler_jobs", {"state": "running"}) == 1
    assert registry.get_sample_value("ibpool_scheduler_queue_jobs", {"queue": "batch", "tenant": "a"}) == 2
    assert registry.get_sample_value("ibpool_scheduler_oldest_wait_seconds", {"queue": "batch"}) == 12.5
