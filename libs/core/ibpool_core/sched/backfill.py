"""EASY backfill: a reservation for the blocked head job, and the capacity later jobs may use. Pure.

The head job that does not fit now gets a reservation at its *shadow time*: running jobs are
released in the order of their planned ends (`RunningJob.planned_end`: start plus
`estimated_runtime(job, safety_margin)`, i.e. the p90 prediction times the margin, or the requested
runtime, capped by the limit) until the placer finds
the head a placement; that time and those hosts are the reservation. A later job may then start now
if it fits and either is estimated to end before the shadow time, or leaves on each reserved host
the GPUs the head needs there (`Backfill.room_after_shadow`). Estimates can be wrong: a job running
past its estimate counts as ending `overrun_grace_s` from now, and jobs past their time limit are
killed by the cycle, which is what bounds the head's delay.
The backfill candidates' check costs O(1) before the placer is asked (GPU count, then estimate).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from .jobs import Job, RunningJob, estimated_runtime
from .placer import FreeView, Placement, Placer

OVERRUN_GRACE_S = 60.0


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    start_at: float
    hosts: list[tuple[int, int]]


def reserve(
    view: FreeView,
    running: Sequence[RunningJob],
    head: Job,
    now: float,
    placer: Placer,
    *,
    max_leaves: int | None,
    sorted_by_end: bool = False,
) -> tuple[Reservation, list[int]] | None:
    """The head's reservation and the free GPUs per host at its shadow time, or None if it never fits.

    Running jobs are released by `planned_end`; a job past it counts as ending `OVERRUN_GRACE_S`
    from now. `sorted_by_end`: the caller guarantees `running` is sorted by `planned_end`, which
    saves a sort (max(end, now + grace) keeps that order). Does not mutate `view`. Cost: one pass
    over the running jobs plus one placer call per release once the free GPUs reach the head's size.
    """
    future = view.copy()
    ordered = running if sorted_by_end else sorted(running, key=lambda r: r.planned_end)
    overdue = now + OVERRUN_GRACE_S
    for run in ordered:
        for host, gpus in run.hosts:
            future.give(host, gpus)
        if future.total_free < head.gpus:
            continue
        placement = placer.place(future, head, max_leaves)
        if placement is not None:
            end = run.planned_end if run.planned_end > overdue else overdue
            return Reservation(job_id=head.id, start_at=end, hosts=placement), future.free
    return None


class Backfill:
    """The room a backfill candidate may use now without delaying the reservation.

    `room_after_shadow[h]` is how many GPUs may still be held on host h past the shadow time: the free
    GPUs at the shadow time minus what the head needs there (absent: unlimited). `restricted` is the
    free view capped by that room; a job estimated to outlast the shadow time is placed on it.
    """

    def __init__(self, reservation: Reservation, free_at_shadow: list[int], now_view: FreeView) -> None:
        self.reservation = reservation
        self.room_after_shadow = {h: free_at_shadow[h] - gpus for h, gpus in reservation.hosts}
        self.restricted = now_view.copy()
        for h, room in self.room_after_shadow.items():
            excess = self.restricted.free[h] - max(0, room)
            if excess > 0:
                self.restricted.take(h, excess)

    def ends_before_shadow(self, job: Job, now: float, safety_margin: float) -> bool:
        return now + estimated_runtime(job, safety_margin) <= self.reservation.start_at

    def record(self, placement: Placement, now_view: FreeView, outlasts_shadow: bool) -> None:
        """Keep `restricted` consistent after `placement` was taken from `now_view`."""
        for h, gpus in placement:
            if outlasts_shadow:
                self.restricted.take(h, gpus)
                if h in self.room_after_shadow:
                    self.room_after_shadow[h] -= gpus
            elif self.restricted.free[h] > now_view.free[h]:
                self.restricted.take(h, self.restricted.free[h] - now_view.free[h])
