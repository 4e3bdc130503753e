"""Fair share with usage decay, the online runtime estimator, and preemption's cheapest victim set."""

from __future__ import annotations

import pytest

from ibpool_core.sched.fairshare import FairShareState, accrue, fairshare_factors
from ibpool_core.sched.jobs import Job
from ibpool_core.sched.placer import FreeView, LeafPlacer
from ibpool_core.sched.preemption import choose_victims
from ibpool_core.sched.queueing import PriorityAging
from ibpool_core.sched.runtime import JobFeatures, RecentMedianEstimator, RuntimeEstimate
from libs.core.tests.sched_builders import cluster, job, run_cycle, running


def test_usage_halves_every_half_life_and_charges_gpus_held() -> None:
    state = accrue(FairShareState(), 100.0, {"a": 2})
    assert state.usage_gpu_s == {"a": 200.0}
    later = accrue(state, 200.0, {}, half_life_s=100.0)
    assert later.usage_gpu_s["a"] == pytest.approx(100.0)


def test_heavy_users_get_lower_factors_and_idle_tenants_one() -> None:
    state = FairShareState(usage_gpu_s={"heavy": 900.0, "light": 100.0}, updated_at=0.0)
    f = fairshare_factors(state, ["idle"])
    assert f["idle"] == 1.0
    assert f["heavy"] < f["light"] < 1.0
    assert f["heavy"] == pytest.approx(2 ** (-0.9 / (1 / 3)))


def test_estimator_falls_back_from_tenant_and_gpus_to_tenant_to_global() -> None:
    est = RecentMedianEstimator(window=8, min_samples=3, prior_s=999.0)
    f = JobFeatures(tenant="a", num_gpus=1, submit_time=0.0)
    assert est.predict(f) == RuntimeEstimate(p50=999.0, p90=999.0)
    est.observe(JobFeatures(tenant="b", num_gpus=4, submit_time=0.0), 50.0)
    assert est.predict(f).p50 == 50.0  # global
    for runtime in (10.0, 20.0, 30.0):
        est.observe(JobFeatures(tenant="a", num_gpus=2, submit_time=0.0), runtime)
    assert est.predict(f).p50 == 20.0  # tenant a, any GPU count
    for runtime in (1.0, 2.0, 3.0, 400.0):
        est.observe(f, runtime)
    assert est.predict(f) == RuntimeEstimate(p50=2.0, p90=400.0)  # tenant a with 1 GPU
    capped = est.predict(JobFeatures(tenant="a", num_gpus=1, submit_time=0.0, requested_limit_s=100.0))
    assert capped.p90 == 100.0


def test_victims_are_the_fewest_gpus_on_one_host() -> None:
    # Host 0: one 4-GPU job and two 2-GPU jobs; host 1: one 8-GPU job. A 4-GPU job needs room.
    runs = [
        running(job("four", gpus=4), [(0, 4)], started=0),
        running(job("two-a", gpus=2), [(0, 2)], started=0),
        running(job("two-b", gpus=2), [(0, 2)], started=50),
        running(job("eight", gpus=8), [(1, 8)], started=0),
    ]
    view = FreeView.of(cluster(2, busy={0: 8, 1: 8}))
    found = choose_victims(
        job("new", gpus=4), runs, view, 100.0, eligible=lambda r: True, placer=LeafPlacer(), hosts_per_leaf=4
    )
    assert found is not None
    victims, placement = found
    assert sorted(v.job.id for v in victims) == ["two-a", "two-b"]
    assert placement == [(0, 4)]


def test_no_victims_when_none_is_eligible() -> None:
    runs = [running(job("eight", gpus=8), [(0, 8)], started=0)]
    view = FreeView.of(cluster(1, busy={0: 8}))
    found = choose_victims(
        job("new", gpus=8), runs, view, 100.0, eligible=lambda r: False, placer=LeafPlacer(), hosts_per_leaf=4
    )
    assert found is None


def test_min_runtime_protects_a_just_started_job() -> None:
    fresh = running(Job(id="fresh", tenant="t", gpus=8, submit_time=0, priority=0), [(0, 8)], started=90)
    reply = run_cycle(
        [job("vip", gpus=8, priority=5)],
        cluster(1, busy={0: 8}),
        policy=PriorityAging(preempt_classes=True),
        running_jobs=[fresh],
        now=100.0,
        min_runtime_s=300.0,
    )
    assert reply.preemptions == []
    reply = run_cycle(
        [job("vip", gpus=8, priority=5)],
        cluster(1, busy={0: 8}),
        policy=PriorityAging(preempt_classes=True),
        running_jobs=[fresh],
        now=1000.0,
        min_runtime_s=300.0,
    )
    assert [p.job_id for p in reply.preemptions] == ["fresh"]
