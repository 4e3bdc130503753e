"""Accounting: the GPU-hours jobs held in a window, by tenant and/or queue, as a pure rule.

`usage(UsageRequest) -> UsageReply`. A job is charged for every allocation it held, from its grant
(`scheduled_at`) to its end (`finished_at`, or `now` while it still holds it), and for the
allocations its earlier attempts held before they were requeued (`JobRecord.held`), each clipped to
the window `[since, until)`. A job holds `gpus_per_host x hosts` GPUs, or `milli / 1000` of one GPU
when it asked for a share (a half-GPU job running one hour is 0.5 GPU-hours), or its MIG profile's
compute share (1g: 1/7 of a GPU). Time waiting in the
queue or in a proposal costs nothing. Rows are sorted by GPU-hours (most first), then by their keys,
and the sums taken in job-id order, so the same jobs give the same bytes in any order.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from typing import Literal

import msgspec

from ..pool.mig import compute_milli
from .records import JobRecord

UsageKey = Literal["tenant", "queue"]


class UsageRequest(msgspec.Struct, frozen=True, kw_only=True):
    jobs: Sequence[JobRecord]
    since: dt.datetime
    until: dt.datetime
    now: dt.datetime
    # What a row is: one per tenant, per queue, or per (tenant, queue).
    by: tuple[UsageKey, ...] = ("tenant", "queue")


class UsageRow(msgspec.Struct, frozen=True, kw_only=True):
    # None where the row is not split by it.
    tenant: str | None = None
    queue: str | None = None
    gpu_hours: float
    # Jobs that held GPUs in the window.
    jobs: int


class UsageReply(msgspec.Struct, frozen=True, kw_only=True):
    since: dt.datetime
    until: dt.datetime
    by: tuple[UsageKey, ...]
    rows: list[UsageRow]
    gpu_hours: float
    jobs: int


def gpus_held(job: JobRecord) -> float:
    """The GPUs the job's allocation holds: a share of one GPU, or a MIG instance, counts as its share."""
    if job.mig_profile is not None and (milli := compute_milli(job.mig_profile)) is not None:
        return milli / 1000
    return job.gpus_per_host * job.hosts * job.milli / 1000


def held_spans(job: JobRecord, now: dt.datetime) -> Iterator[tuple[dt.datetime, dt.datetime]]:
    """(start, end) of every allocation the job held: its earlier attempts', then the current one's."""
    for span in job.held:
        yield span.start, span.end
    if job.scheduled_at is not None:
        yield job.scheduled_at, job.finished_at if job.finished_at is not None else now


def usage(request: UsageRequest) -> UsageReply:
    """See the module docstring."""
    since, until = request.since, min(request.until, request.now)
    seconds: dict[tuple[str | None, str | None], float] = {}
    counted: dict[tuple[str | None, str | None], int] = {}
    for job in sorted(request.jobs, key=lambda j: j.job_id):  # one order of the sums, whatever came in
        held_s = sum(
            max(0.0, (min(end, until) - max(start, since)).total_seconds())
            for start, end in held_spans(job, request.now)
        )
        if held_s <= 0.0:
            continue
        key = (
            job.tenant if "tenant" in request.by else None,
            job.queue if "queue" in request.by else None,
        )
        seconds[key] = seconds.get(key, 0.0) + held_s * gpus_held(job)
        counted[key] = counted.get(key, 0) + 1
    rows = [
        UsageRow(tenant=tenant, queue=queue, gpu_hours=gpu_s / 3600, jobs=counted[(tenant, queue)])
        for (tenant, queue), gpu_s in seconds.items()
    ]
    rows.sort(key=lambda r: (-r.gpu_hours, r.tenant or "", r.queue or ""))
    return UsageReply(
        since=request.since,
        until=request.until,
        by=request.by,
        rows=rows,
        gpu_hours=sum(r.gpu_hours for r in rows),
        jobs=sum(r.jobs for r in rows),
    )
