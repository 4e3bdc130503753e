"""The scheduling cycle: gangs whole or not at all, leaf span, reasons, kills, EASY backfill."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ibpool_core.sched.backfill import reserve
from ibpool_core.sched.jobs import host_shares
from ibpool_core.sched.placer import FreeView, LeafPlacer, min_leaf_span
from libs.core.tests.sched_builders import cluster, job, run_cycle, running, started


def test_a_gang_waits_for_one_leaf_rather_than_spanning_two() -> None:
    # Leaves of 4 hosts: hosts 0-3 and 4-7; each leaf has only one whole host free.
    view = cluster(8, busy={0: 8, 1: 8, 2: 8, 4: 8, 5: 8, 6: 8})
    reply = run_cycle([job("gang", gpus=16, submit=90)], view, backfill="none")
    assert started(reply) == []
    assert reply.waiting["gang"].text() == "waiting for 2 hosts with 8 free GPUs"
    assert reply.waiting["gang"].code == "unschedulable"


def test_a_gang_spans_leaves_once_it_waited_long_enough() -> None:
    view = cluster(8, busy={0: 8, 1: 8, 2: 8, 4: 8, 5: 8, 6: 8})
    reply = run_cycle([job("gang", gpus=16, submit=0)], view, backfill="none", now=90_000.0)
    assert reply.starts[0].hosts == [(3, 8), (7, 8)]
    assert (reply.starts[0].leaves, reply.starts[0].min_leaves) == (2, 1)


def test_a_gang_takes_the_fullest_leaf_that_holds_it() -> None:
    view = cluster(8, busy={0: 8, 1: 8})  # leaf 0 has 2 whole hosts, leaf 1 has 4
    reply = run_cycle([job("gang", gpus=16)], view)
    assert reply.starts[0].hosts == [(2, 8), (3, 8)]


def test_single_host_jobs_go_best_fit() -> None:
    view = cluster(3, busy={0: 2, 1: 6})
    reply = run_cycle([job("two", gpus=2)], view)
    assert reply.starts[0].hosts == [(1, 2)]


def test_strict_fifo_stops_at_the_first_job_that_does_not_fit() -> None:
    view = cluster(1, busy={0: 6})
    reply = run_cycle([job("big", gpus=4), job("small", gpus=1, submit=1)], view, backfill="none")
    assert started(reply) == []


def test_easy_backfills_a_job_that_ends_before_the_reservation() -> None:
    # Host 0 is full until 1100 (planned); the 8-GPU head waits; host 1 has 2 free GPUs.
    hog = running(job("hog", gpus=8), [(0, 8)], started=0, end=1100)
    half = running(job("half", gpus=6), [(1, 6)], started=0, end=5000)
    queue = [
        job("head", gpus=8, submit=10, p50=100),
        job("short", gpus=2, submit=20, p50=100, p90=100),
        job("long", gpus=2, submit=30, p50=1e6, p90=1e6),
    ]
    reply = run_cycle(queue, cluster(2, busy={0: 8, 1: 6}), running_jobs=[hog, half], now=100.0)
    assert reply.reservation is not None
    assert (reply.reservation.job_id, reply.reservation.start_at, reply.reservation.hosts) == ("head", 1100, [(0, 8)])
    assert started(reply) == ["short"]
    head = reply.waiting["head"].text()
    assert head.startswith("waiting for 8 GPUs on one host; earliest estimated start 1970-01-01 00:18")


def test_easy_holds_back_a_long_job_that_would_take_the_heads_gpus() -> None:
    hog = running(job("hog", gpus=6), [(0, 6)], started=0, end=1100)
    queue = [job("head", gpus=8, submit=10, p50=100), job("long", gpus=2, submit=30, p50=1e6)]
    reply = run_cycle(queue, cluster(2, busy={0: 6, 1: 8}), running_jobs=[hog], now=100.0)
    # The head needs host 0 whole at 1100: a long 2-GPU job there would delay it, so it waits.
    assert started(reply) == []
    assert reply.waiting["long"].text() == "would delay the reservation of head"
    assert (reply.waiting["long"].code, reply.waiting["long"].behind) == ("reservation", "head")


def test_jobs_past_their_limit_are_killed_and_their_gpus_reused() -> None:
    over = running(job("over", gpus=8, limit=50.0), [(0, 8)], started=0)
    reply = run_cycle([job("next", gpus=8)], cluster(1, busy={0: 8}), running_jobs=[over], now=100.0)
    assert reply.kills == ["over"]
    assert started(reply) == ["next"]


gpu_counts = st.sampled_from([1, 2, 4, 8, 12, 16, 24, 32])


@settings(max_examples=120, deadline=None)
@given(
    busy=st.lists(st.integers(min_value=0, max_value=8), min_size=8, max_size=8),
    sizes=st.lists(gpu_counts, min_size=1, max_size=10),
    mode=st.sampled_from(["none", "greedy", "easy"]),
)
def test_gangs_are_placed_whole_or_not_at_all(busy: list[int], sizes: list[int], mode: str) -> None:
    view = cluster(8, busy=dict(enumerate(busy)))
    queue = [job(f"j{i}", gpus=g, submit=float(i), p50=100.0) for i, g in enumerate(sizes)]
    others = [running(job(f"r{h}", gpus=b), [(h, b)], started=0, end=500.0 + h) for h, b in enumerate(busy) if b]
    reply = run_cycle(queue, view, backfill=mode, running_jobs=others, now=90_000.0)
    by_id = {j.id: j for j in queue}
    used = [0] * 8
    for s in reply.starts:
        j = by_id[s.job_id]
        assert sorted(g for _, g in s.hosts) == sorted(host_shares(j))
        assert len({h for h, _ in s.hosts}) == j.hosts
        for h, g in s.hosts:
            used[h] += g
    assert all(used[h] <= view.free[h] for h in range(8))


@settings(max_examples=120, deadline=None)
@given(
    busy_ends=st.lists(st.tuples(st.integers(min_value=1, max_value=8), st.floats(200, 5000)), min_size=8, max_size=8),
    sizes=st.lists(st.tuples(gpu_counts, st.floats(10, 10_000)), min_size=2, max_size=10),
)
def test_backfill_never_delays_the_head_reservation(
    busy_ends: list[tuple[int, float]], sizes: list[tuple[int, float]]
) -> None:
    """Starting the backfilled jobs (as if they ran to their estimates) leaves the head's reservation intact."""
    now = 100.0
    view = cluster(8, busy={h: b for h, (b, _) in enumerate(busy_ends)})
    runs = sorted(
        (running(job(f"r{h}", gpus=b), [(h, b)], started=0, end=e) for h, (b, e) in enumerate(busy_ends)),
        key=lambda r: r.planned_end,
    )
    queue = [job(f"j{i}", gpus=g, submit=float(i), p50=d, p90=d) for i, (g, d) in enumerate(sizes)]
    reply = run_cycle(queue, view, backfill="easy", running_jobs=runs, now=now, safety_margin=1.0)
    if reply.reservation is None:
        return
    head = next(j for j in queue if j.id == reply.reservation.job_id)
    by_id = {j.id: j for j in queue}
    backfilled = [
        running(by_id[s.job_id], [tuple(h) for h in s.hosts], started=now, end=s.planned_end) for s in reply.starts
    ]
    after = cluster(8, busy={h: b for h, (b, _) in enumerate(busy_ends)})
    for r in backfilled:
        for h, g in r.hosts:
            after.free[h] -= g
    span = min_leaf_span(head.hosts, 4) if head.hosts > 1 else None  # as the cycle reserved it
    again = reserve(
        FreeView.of(after),
        sorted(runs + backfilled, key=lambda r: r.planned_end),
        head,
        now,
        LeafPlacer(),
        max_leaves=span,
    )
    assert again is not None
    assert again[0].start_at <= reply.reservation.start_at


def test_a_running_job_whose_gpus_are_already_free_frees_nothing_more_at_the_shadow_time() -> None:
    """The ledger can show a job's GPUs free before its exit is handled (its allocation was revoked
    or released); the reservation then counts no host past its capacity (this raised IndexError
    in a live cycle)."""
    view = FreeView.of(cluster(2, busy={0: 4}))  # host 0: 4 free of 8, host 1: 8 free of 8
    gone = running(job("gone", 8), [(1, 8)], end=200.0)  # its GPUs on host 1 are free already
    holder = running(job("holder", 4), [(0, 4)], end=500.0)
    head = job("head", 16)
    found = reserve(view, [gone, holder], head, 100.0, LeafPlacer(), max_leaves=None)
    assert found is not None
    reservation, free_at_shadow = found
    assert reservation.start_at == 500.0 and sorted(reservation.hosts) == [(0, 8), (1, 8)]
    assert free_at_shadow == [8, 8]
    assert view.free == [4, 8]  # not mutated
