"""The learned Gittins policy and 1D-LAS as tables: (history, queue, running, free) -> decision."""

from __future__ import annotations

import pytest

from ibpool_core.sched.queueing import LearnedGittins, LeastAttainedService, make_policy
from ibpool_core.sched.runtime import JobFeatures, RuntimeHistory
from libs.core.tests.sched_builders import cluster, job, run_cycle, running, started


def history(observed: list[tuple[str, int, float]], **kw: int) -> RuntimeHistory:
    h = RuntimeHistory(**kw)
    for tenant, gpus, runtime in observed:
        h.observe(JobFeatures(tenant=tenant, num_gpus=gpus, submit_time=0.0), runtime)
    return h


# The samples a job's index is read from: the most specific key with `min_samples` observations.
SAMPLE_CASES = [
    ("own tenant and GPU count", [("a", 1, 10.0)] * 3 + [("a", 2, 99.0)] * 3, ("a", 1), (10.0, 10.0, 10.0)),
    ("too few of its GPU count: the tenant", [("a", 1, 10.0)] * 2 + [("a", 2, 20.0)] * 2, ("a", 1), (10, 10, 20, 20)),
    ("unknown tenant: everything", [("a", 1, 10.0)] * 3 + [("b", 1, 5.0)], ("c", 1), (5.0, 10.0, 10.0, 10.0)),
    ("nothing observed yet", [], ("a", 1), ()),
]


@pytest.mark.parametrize(("observed", "ask", "want"), [c[1:] for c in SAMPLE_CASES], ids=[c[0] for c in SAMPLE_CASES])
def test_history_samples_fall_back_from_tenant_and_gpus_to_tenant_to_all(
    observed: list[tuple[str, int, float]], ask: tuple[str, int], want: tuple[float, ...]
) -> None:
    assert history(observed, min_samples=3).samples(*ask) == tuple(float(w) for w in want)


def test_history_keeps_only_the_window_and_counts_versions() -> None:
    h = history([("a", 1, float(r)) for r in range(10)], window=4, min_samples=1)
    assert h.samples("a", 1) == (6.0, 7.0, 8.0, 9.0)
    assert h.version == 10


def test_history_rejects_bad_input_saying_what() -> None:
    with pytest.raises(ValueError, match="runtime of a/1 GPUs must be >= 0"):
        history([("a", 1, -5.0)])
    with pytest.raises(ValueError, match="window and min_samples"):
        RuntimeHistory(window=0)


# One free GPU, two fresh 1-GPU jobs waiting: which starts depends on what each one's virtual
# cluster's finished jobs say, not on a global sample.
SHORT_VC = [("short-vc", 1, 30.0)] * 20
LONG_VC = [("long-vc", 1, 50_000.0)] * 20
ORDER_CASES = [
    ("short kind first though it came later", SHORT_VC + LONG_VC, ["short"]),
    ("no history: FIFO", [], ["long"]),
    (
        "mostly short but a heavy tail still beats always-long",
        SHORT_VC[:15] + [("short-vc", 1, 9e5)] * 5 + LONG_VC,
        ["short"],
    ),
]


@pytest.mark.parametrize(("observed", "want"), [c[1:] for c in ORDER_CASES], ids=[c[0] for c in ORDER_CASES])
def test_learned_gittins_orders_fresh_jobs_by_their_own_kind(
    observed: list[tuple[str, int, float]], want: list[str]
) -> None:
    pol = LearnedGittins(history=history(observed))
    queue = [job("long", tenant="long-vc", submit=0), job("short", tenant="short-vc", submit=10)]
    reply = run_cycle(queue, cluster(1, busy={0: 7}), policy=pol, backfill="greedy")
    assert started(reply) == want


def test_learned_gittins_past_the_short_mode_ranks_below_a_fresh_job_of_the_same_kind() -> None:
    # 90% of the kind ends by 100 s: a job of it that already ran 200 s is likely one of the long ones.
    h = history([("vc", 1, 100.0)] * 18 + [("vc", 1, 40_000.0)] * 2)
    pol = LearnedGittins(history=h, thresholds=[1e9])
    fresh, ran = job("fresh", tenant="vc", submit=50), job("ran", tenant="vc", submit=0, attained=200)
    assert pol.order_key(pol.orders[0], fresh, {}) < pol.order_key(pol.orders[0], ran, {})


def test_learned_gittins_key_is_fixed_at_queueing_and_follows_new_history_after() -> None:
    h = history([("vc", 1, 100.0)] * 10 + [("other", 1, 10.0)] * 10)
    pol = LearnedGittins(history=h)
    a = job("a", tenant="vc")
    before = pol.order_key(pol.orders[0], a, {})
    assert pol.order_key(pol.orders[0], a, {}) == before  # memoised while nothing ended
    for _ in range(300):
        h.observe(JobFeatures(tenant="vc", num_gpus=1, submit_time=0.0), 90_000.0)
    assert pol.order_key(pol.orders[0], a, {}) > before  # a later queueing sees the longer runtimes


# 2D-LAS (GPU-time) vs 1D-LAS (time) on the same cluster: one host, an 8-GPU job that ran 1,000 s
# (8,000 GPU-s), a fresh 8-GPU job waiting, threshold 3,600 (GPU-s or s).
PREEMPT_CASES = [
    ("gpu-time: 8,000 GPU-s is past 3,600, preempted", "gpu-time", ["ran-1000s"]),
    ("time: 1,000 s is not past 3,600 s, kept", "time", []),
]


@pytest.mark.parametrize(("service", "want"), [c[1:] for c in PREEMPT_CASES], ids=[c[0] for c in PREEMPT_CASES])
def test_las_service_unit_decides_who_is_preempted(service: str, want: list[str]) -> None:
    pol = LeastAttainedService(thresholds=[3600.0], service=service)
    runs = [running(job("ran-1000s", gpus=8), [(0, 8)], started=0)]
    reply = run_cycle(
        [job("new", gpus=8, submit=900)],
        cluster(1, busy={0: 8}),
        policy=pol,
        now=1000.0,
        running_jobs=runs,
        backfill="greedy",
    )
    assert [p.job_id for p in reply.preemptions] == want


@pytest.mark.parametrize(
    ("service", "gpus", "want"),
    [("gpu-time", 8, (10.0, 100.0)), ("time", 8, (80.0, 800.0)), ("time", 1, (10.0, 100.0)), (0.5, 4, (20.0, 200.0))],
)
def test_thresholds_in_gpu_seconds_tell_the_simulator_when_a_job_changes_queue(
    service: str | float, gpus: int, want: tuple[float, ...]
) -> None:
    assert LeastAttainedService(thresholds=[100.0, 10.0], service=service).thresholds_gpu_s(gpus) == want


def test_unknown_service_unit_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"LAS service must be one of gpu-time, time or an exponent, got 'gpu'"):
        make_policy("gittins-learned", service="gpu")


# ranks="index": one host full with a 1-GPU-per-slot mix; one running job of a kind, one fresh
# waiting job of another. Kinds: "soon" jobs all run 1,000 s, "long" 50,000 s, "short" 100 s.
KINDS = [("soon", 1, 1000.0)] * 20 + [("long", 1, 50_000.0)] * 20 + [("short", 1, 100.0)] * 20
INDEX_CASES = [
    # LAS queues: 900 s passed the 600 s threshold, so any fresh job preempts it.
    ("queue ranks: demoted job preempted", "queue", "soon", 900.0, "long", ["run"]),
    # Its kind ends at 1,000 s: index 1/400 at 600 s vs 1/50,000 for the fresh long job: kept.
    ("index: about to finish, kept", "index", "soon", 900.0, "long", []),
    # Past every run of its kind (1,500 s passed): index 1/1,500; a fresh 100 s job (1/100) takes it.
    ("index: past its kind, preempted", "index", "soon", 2000.0, "short", ["run"]),
    ("index: long kind, preempted by a short one", "index", "long", 900.0, "short", ["run"]),
    # Within the margin of 2: 1/1,500 vs 1/1,000 for a fresh "soon" job: no thrash.
    ("index: close indices, kept", "index", "soon", 2000.0, "soon", []),
]


@pytest.mark.parametrize(
    ("ranks", "run_kind", "ran_s", "wait_kind", "want"),
    [c[1:] for c in INDEX_CASES],
    ids=[c[0] for c in INDEX_CASES],
)
def test_learned_gittins_preempts_by_index_or_by_queue(
    ranks: str, run_kind: str, ran_s: float, wait_kind: str, want: list[str]
) -> None:
    pol = LearnedGittins(history=history(KINDS), thresholds=[600.0, 1500.0, 6000.0], service="time", ranks=ranks)
    runs = [running(job("run", gpus=8, tenant=run_kind), [(0, 8)], started=0)]
    # Only the GPU count of the history key matters: 8-GPU jobs fall back to the tenant's runtimes.
    reply = run_cycle(
        [job("wait", gpus=8, tenant=wait_kind, submit=ran_s - 10)],
        cluster(1, busy={0: 8}),
        policy=pol,
        now=ran_s,
        running_jobs=runs,
        backfill="greedy",
    )
    assert [p.job_id for p in reply.preemptions] == want
    assert started(reply) == (["wait"] if want else [])


def test_learned_gittins_index_ranks_order_the_queue_by_index_alone() -> None:
    pol = LearnedGittins(history=history(KINDS), thresholds=[600.0], service="time", ranks="index")
    # A requeued "soon" job at 900 s (its kind ends 100 s later) goes before a fresh "long" one.
    q = [job("long-fresh", tenant="long", submit=0), job("soon-requeued", tenant="soon", submit=5, attained=900)]
    ordered = sorted(q, key=lambda j: pol.order_key(pol.orders[0], j, {}))
    assert [j.id for j in ordered] == ["soon-requeued", "long-fresh"]


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"ranks": "lottery"}, "ranks must be queue or index, got 'lottery'"),
        ({"index_margin": 0.5}, "index_margin must be >= 1"),
        ({"refresh_every": 0}, "refresh_every >= 1"),
    ],
)
def test_learned_gittins_refuses_bad_parameters(params: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_policy("gittins-learned", **params)
