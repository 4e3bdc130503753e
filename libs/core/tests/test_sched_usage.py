"""usage(): GPU-hours held in a window, by tenant and queue, from job records built here."""

from __future__ import annotations

import datetime as dt

import msgspec

from ibpool_core.sched.records import HeldSpan, JobRecord, finished, granted, requeued
from ibpool_core.sched.usage import UsageRequest, UsageRow, usage

T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def h(hours: float) -> dt.datetime:
    return T0 + dt.timedelta(hours=hours)


def job(job_id: str, tenant: str = "ml", queue: str = "train", **kw: object) -> JobRecord:
    return JobRecord(job_id=job_id, tenant=tenant, queue=queue, submitted_at=T0, queued_at=T0, **kw)  # type: ignore[arg-type]


def ran(j: JobRecord, start: float, end: float | None) -> JobRecord:
    g = granted(j, f"a-{j.job_id}", ["n1"], h(start))
    return g if end is None else finished(g, "completed", "exit 0", h(end))


def test_gpus_times_hours_clipped_to_the_window_split_by_tenant_and_queue() -> None:
    jobs = [
        ran(job("gang", hosts=2, gpus_per_host=8), 1, 3),  # 16 GPUs x 2 h
        ran(job("early", gpus_per_host=4), -5, 2),  # 4 GPUs, 2 h inside the window (0..10)
        ran(job("half", tenant="web", queue="serve", milli=500), 8, None),  # running: half a GPU, 8 h..now 12 h
        ran(job("late"), 11, 12),  # after the window
        job("waiting", gpus_per_host=8),  # never granted: nothing
    ]
    reply = usage(UsageRequest(jobs=jobs, since=h(0), until=h(10), now=h(12)))
    assert reply.rows == [
        UsageRow(tenant="ml", queue="train", gpu_hours=16 * 2 + 4 * 2, jobs=2),
        UsageRow(tenant="web", queue="serve", gpu_hours=0.5 * 2, jobs=1),
    ]
    assert (reply.gpu_hours, reply.jobs) == (41.0, 3)
    by_tenant = usage(UsageRequest(jobs=jobs, since=h(0), until=h(24), now=h(12), by=("tenant",)))
    assert [(r.tenant, r.queue, r.gpu_hours) for r in by_tenant.rows] == [("ml", None, 41.0), ("web", None, 2.0)]


def test_a_requeued_job_is_charged_for_every_attempt_and_not_for_its_wait() -> None:
    j = ran(job("r", gpus_per_host=2), 1, None)
    j = requeued(j, "node n1 failed", h(2), None)  # held 1..2
    assert j.held == [HeldSpan(start=h(1), end=h(2))] and j.scheduled_at is None
    j = ran(j, 4, 7)  # waited 2..4, held 4..7
    reply = usage(UsageRequest(jobs=[j], since=h(0), until=h(10), now=h(10)))
    assert [r.gpu_hours for r in reply.rows] == [2 * (1 + 3)]
    # A stored body of before `held` existed decodes with none.
    old = msgspec.json.decode(msgspec.json.encode(j).replace(b',"held":[', b',"_x":['), type=JobRecord)
    assert old.held == []


def test_the_same_jobs_give_the_same_bytes_whatever_their_order() -> None:
    jobs = [
        ran(job(f"j{i}", tenant=f"t{i % 3}", queue=f"q{i % 2}", gpus_per_host=1 + i % 4), i % 5, 6) for i in range(30)
    ]
    a = usage(UsageRequest(jobs=jobs, since=h(0), until=h(10), now=h(10)))
    b = usage(UsageRequest(jobs=list(reversed(jobs)), since=h(0), until=h(10), now=h(10)))
    assert msgspec.json.encode(a) == msgspec.json.encode(b)
    assert [r.gpu_hours for r in a.rows] == sorted((r.gpu_hours for r in a.rows), reverse=True)


def test_an_empty_window_charges_nothing() -> None:
    reply = usage(UsageRequest(jobs=[ran(job("x"), 1, 3)], since=h(5), until=h(5), now=h(6)))
    assert (reply.rows, reply.gpu_hours, reply.jobs) == ([], 0.0, 0)


def test_a_mig_instance_is_charged_its_compute_share() -> None:
    reply = usage(UsageRequest(jobs=[ran(job("m", mig_profile="3g.40gb"), 0, 7)], since=h(0), until=h(7), now=h(7)))
    assert [round(r.gpu_hours, 6) for r in reply.rows] == [round(7 * 428 / 1000, 6)]  # 3 of 7 slices, 7 hours
