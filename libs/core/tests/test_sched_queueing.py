"""Queue policies as tables: (policy, queue, free capacity) -> which jobs start, in which order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibpool_core.sched.jobs import QueueStats
from ibpool_core.sched.queueing import (
    POLICIES,
    Dynamic,
    Gittins,
    LeastAttainedService,
    PriorityAging,
    gittins_index,
    make_policy,
)
from libs.core.tests.sched_builders import cluster, job, run_cycle, running, started

# One host with 2 free GPUs: the policy picks which two 1-GPU jobs of the queue start.
QUEUE = [
    job("old-long", submit=0, p50=9000, true=50),
    job("mid-short", submit=10, p50=10, true=9000),
    job("new-mid", submit=20, p50=100, true=100, priority=1),
    job("newest-big", gpus=2, submit=30, p50=20, true=20),
]
CASES = [
    ("fifo", ["old-long", "mid-short"]),
    ("sjf", ["mid-short", "new-mid"]),  # predicted p50: 10, 20 (2 GPUs, blocked), 100
    ("oracle-sjf", ["newest-big"]),  # true runtimes: 20 first (2 GPUs fill the host)
    ("predictive", ["mid-short", "new-mid"]),  # GPU-time: 10, 40 (blocked), 100
    ("priority", ["new-mid", "old-long"]),  # class 1 first, then by age
]


@pytest.mark.parametrize(("policy", "want"), CASES)
def test_policy_starts_jobs_in_its_order(policy: str, want: list[str]) -> None:
    reply = run_cycle(QUEUE, cluster(1, busy={0: 6}), policy=policy, backfill="greedy")
    assert started(reply) == want


def test_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match=r"known: .*fifo"):
        make_policy("nope")


def test_every_registered_policy_builds_and_orders_totally() -> None:
    for name in POLICIES:
        pol = make_policy(name)
        keys = [pol.order_key(pol.orders[0], j, {}) for j in QUEUE]
        assert len(set(keys)) == len(keys)


def test_las_orders_by_attained_service_queue_then_fifo() -> None:
    las = LeastAttainedService(thresholds=[100.0])
    q = [job("served", submit=0, attained=500), job("fresh-late", submit=50), job("fresh-early", submit=5)]
    reply = run_cycle(q, cluster(1, busy={0: 6}), policy=las, backfill="greedy")
    assert started(reply) == ["fresh-early", "fresh-late"]


def test_las_preempts_only_jobs_in_a_lower_queue_that_ran_long_enough() -> None:
    las = LeastAttainedService(thresholds=[1000.0])
    long_runner = job("long", gpus=8, attained=0)
    young = job("young", gpus=8)
    runs = [
        # 8 GPUs for 900 s = 7200 GPU-s attained: queue 1.
        running(long_runner, [(0, 8)], started=0),
        running(young, [(1, 8)], started=850),
    ]
    reply = run_cycle(
        [job("new", gpus=8, submit=890)],
        cluster(2, busy={0: 8, 1: 8}),
        policy=las,
        now=900.0,
        running_jobs=runs,
        backfill="greedy",
    )
    assert [(p.job_id, p.for_job_id) for p in reply.preemptions] == [("long", "new")]
    assert reply.starts[0].hosts == [(0, 8)]


def test_srtf_preempts_the_longer_remaining_job() -> None:
    runs = [running(job("rest-5000", gpus=8, true=6000), [(0, 8)], started=0)]
    reply = run_cycle(
        [job("short", gpus=8, true=50, submit=900)],
        cluster(1, busy={0: 8}),
        policy="oracle-srtf",
        now=1000.0,
        running_jobs=runs,
        backfill="greedy",
    )
    assert [p.job_id for p in reply.preemptions] == ["rest-5000"]
    assert started(reply) == ["short"]


def test_gittins_index_prefers_jobs_likely_to_finish_soon() -> None:
    samples = sorted([10.0] * 90 + [10_000.0] * 10)
    fresh = gittins_index(samples, 0.0, [10.0, 100.0])
    past_the_short_mode = gittins_index(samples, 20.0, [10.0, 100.0])
    assert fresh > past_the_short_mode
    pol = Gittins(samples=samples, thresholds=[1e9])
    assert pol.order_key("gittins", job("a", attained=0), {}) < pol.order_key("gittins", job("b", attained=20), {})


def test_priority_key_does_not_depend_on_time_and_fairshare_lifts_light_tenants() -> None:
    pol = PriorityAging(aging_s=100.0)
    heavy, light = job("h", tenant="heavy", submit=0), job("l", tenant="light", submit=50)
    shares = {"heavy": 0.1, "light": 1.0}
    assert pol.order_key("priority", light, shares) < pol.order_key("priority", heavy, shares)
    # Without fair share, the older job is first.
    assert pol.order_key("priority", heavy, {}) < pol.order_key("priority", light, {})


@settings(max_examples=60, deadline=None)
@given(
    classes=st.lists(st.integers(min_value=0, max_value=5), min_size=2, max_size=12),
    gaps=st.lists(st.floats(min_value=0, max_value=1000), min_size=12, max_size=12),
)
def test_aging_bounds_how_long_any_job_can_be_passed(classes: list[int], gaps: list[float]) -> None:
    """No starvation: a job submitted earlier by more than class_weight * dP * aging_s outranks any later one."""
    pol = PriorityAging(class_weight=2.0, fairshare_weight=0.0, aging_s=100.0)
    submits = [sum(gaps[:i]) for i in range(len(classes))]
    jobs = [job(f"j{i}", submit=s, priority=c) for i, (s, c) in enumerate(zip(submits, classes, strict=True))]
    victim = jobs[0]
    later = job("late", submit=victim.submit_time + 2.0 * 5 * 100.0 + 1.0, priority=5)
    assert pol.order_key("priority", victim, {}) < pol.order_key("priority", later, {})
    ordered = sorted([*jobs, later], key=lambda j: pol.order_key("priority", j, {}))
    assert ordered.index(victim) < ordered.index(later)


def test_dynamic_rule_switches_on_live_state() -> None:
    pol = Dynamic(qssf_from=3, starve_after_s=1000.0, thresholds=[100.0])
    assert pol.choose_order(QueueStats(queue_len=2)) == "gittins"
    assert pol.choose_order(QueueStats(queue_len=50, oldest_wait_s=9999, recent_wait_p90_s=10)) == "las-qssf"
    assert pol.choose_order(QueueStats(queue_len=50, recent_wait_p90_s=2000)) == "gittins"
    small_late, big_early = job("small", submit=10, p50=10), job("big", gpus=4, submit=0, p50=100)
    demoted = job("demoted", submit=0, p50=1, attained=500)
    qssf = sorted([big_early, demoted, small_late], key=lambda j: pol.order_key("las-qssf", j, {}))
    fifo = sorted([big_early, demoted, small_late], key=lambda j: pol.order_key("gittins", j, {}))
    assert [j.id for j in qssf] == ["small", "big", "demoted"]
    assert [j.id for j in fifo] == ["big", "small", "demoted"]
