"""What the scheduler's /metrics says of its jobs: a pure summary of the live jobs (`count_jobs`) and
the collector that reads it at scrape time. Nothing here decides or changes a job.

Waiting means not granted yet: `queued` or `proposed` (a proposal the allocator has not answered).
A job waits since it last entered the queue (`queued_at`: its submission, or its requeue).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator

import msgspec
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ibpool_core.sched.records import LIVE, JobRecord, JobState

WAITING: tuple[JobState, ...] = ("queued", "proposed")

# Seconds to days: a short interactive wait, a night's backlog, a week-long starvation.
WAIT_BUCKETS = (
    1.0,
    5.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
    43200.0,
    86400.0,
    259200.0,
    604800.0,
)


class JobCounts(msgspec.Struct, frozen=True, kw_only=True):
    """`by_state`: live jobs per live state (every one, 0 included); `waiting`: (queue, tenant) -> jobs
    waiting; `oldest_wait_s`: queue -> how long its oldest waiting job has waited (0 for a queue
    named in `queues` or holding live jobs while none of them waits)."""

    by_state: dict[str, int]
    waiting: dict[tuple[str, str], int]
    oldest_wait_s: dict[str, float]


def count_jobs(jobs: Iterable[JobRecord], now: dt.datetime, queues: Iterable[str] = ()) -> JobCounts:
    """The summary of the live `jobs` at `now`; `queues`: queues to report even with no job (the configured ones)."""
    by_state: dict[str, int] = dict.fromkeys(LIVE, 0)
    waiting: dict[tuple[str, str], int] = {}
    oldest = dict.fromkeys(queues, 0.0)
    for job in jobs:
        by_state[job.state] = by_state.get(job.state, 0) + 1
        oldest.setdefault(job.queue, 0.0)
        if job.state in WAITING:
            key = (job.queue, job.tenant)
            waiting[key] = waiting.get(key, 0) + 1
            waited = max(0.0, (now - job.queued_at).total_seconds())
            oldest[job.queue] = max(oldest[job.queue], waited)
    return JobCounts(by_state=by_state, waiting=waiting, oldest_wait_s=oldest)


class JobsCollector(Collector):
    """`ibpool_scheduler_jobs{state}`, `ibpool_scheduler_queue_jobs{queue,tenant}` and
    `ibpool_scheduler_oldest_wait_seconds{queue}` from `read()` at scrape time; nothing while it
    returns None (a standby, whose picture of the jobs is not kept current)."""

    def __init__(self, read: Callable[[], JobCounts | None]) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts = self.read()
        if counts is None:
            return
        states = GaugeMetricFamily(
            "ibpool_scheduler_jobs", "Live jobs by lifecycle state (leader only)", labels=["state"]
        )
        for state, n in counts.by_state.items():
            states.add_metric([state], n)
        waiting = GaugeMetricFamily(
            "ibpool_scheduler_queue_jobs",
            "Jobs waiting (queued or proposed, not yet granted) by queue and tenant (leader only)",
            labels=["queue", "tenant"],
        )
        for (queue, tenant), n in sorted(counts.waiting.items()):
            waiting.add_metric([queue, tenant], n)
        oldest = GaugeMetricFamily(
            "ibpool_scheduler_oldest_wait_seconds",
            "How long the oldest waiting job of a queue has waited since it entered the queue; 0 when none waits"
            " (leader only)",
            labels=["queue"],
        )
        for queue, seconds in sorted(counts.oldest_wait_s.items()):
            oldest.add_metric([queue], seconds)
        yield states
        yield waiting
        yield oldest
