"""The cluster simulator drives the scheduling core: invariants on Philly, reproducibility, cost model."""

from __future__ import annotations

import math

import pytest

from ibpool_core.sched.cycle import CycleConfig
from ibpool_sim.cluster_sim import CostModel, HostFailure, SimConfig, SimLoop, SimResult, make_sim_policy, simulate
from ibpool_sim.sched_lineup import LINEUP, RunOptions, check_floors, config_for, random_failures
from ibpool_sim.shared_data import need
from ibpool_sim.traces import TraceJob, philly_trace_jobs


def synthetic(n: int = 120) -> list[TraceJob]:
    sizes = [1, 1, 2, 4, 8, 16, 1, 24, 1, 32]
    return [
        TraceJob(
            id=f"j{i}",
            tenant=f"t{i % 3}",
            gpus=sizes[i % len(sizes)],
            submit_s=float(i * 37),
            duration_s=60.0 + (i * 7919) % 5000,
        )
        for i in range(n)
    ]


def assert_sane(result: SimResult, trace: list[TraceJob]) -> None:
    by_id = {t.id: t for t in trace}
    assert sorted(o.id for o in result.outcomes) == sorted(by_id), "every job finishes exactly once"
    # SHARP shortens a gang's allreduce below the trace's (measured without it): never more than its share.
    floor = 1.0 - CostModel().comm_fraction
    for o in result.outcomes:
        assert o.first_start_s >= o.submit_s
        assert o.end_s - o.submit_s >= by_id[o.id].duration_s * (floor if o.sharp else 1.0) - 1e-6, o
    summary = result.summary()
    assert 0.0 < float(summary["utilisation"]) <= 1.0
    assert float(summary["avg_jct_s"]) >= float(summary["avg_queue_s"])


@pytest.mark.parametrize("entry", LINEUP, ids=[e.label for e in LINEUP])
def test_every_policy_finishes_every_job_on_a_synthetic_trace(entry: object) -> None:
    trace = synthetic()
    result = simulate(trace, config_for(entry, RunOptions(nodes=6)))  # type: ignore[arg-type]
    assert_sane(result, trace)


@pytest.mark.parametrize("entry", LINEUP, ids=[e.label for e in LINEUP])
def test_every_policy_finishes_every_job_with_the_service_placement_profile(entry: object) -> None:
    trace = synthetic()
    options = RunOptions(nodes=24, placement="framework", sharp_leaf_share=0.5)
    result = simulate(trace, config_for(entry, options))  # type: ignore[arg-type]
    assert_sane(result, trace)
    summary = result.summary()
    assert summary["min_span_share"] == 1.0  # gangs wait for their minimal leaf span by default
    assert 0.0 < float(summary["sharp_share"]) <= 1.0


def test_framework_placement_turns_sharp_on_only_under_sharp_leaves_and_it_shortens_gangs() -> None:
    # Gangs of 4 hosts (32 GPUs) one after the other on 2 leaves of 8 hosts: each fits one leaf.
    trace = [TraceJob(id=f"g{i}", tenant="t", gpus=32, submit_s=i * 10_000.0, duration_s=1000.0) for i in range(4)]
    runs = {}
    for share in (0.0, 1.0):
        config = SimConfig(nodes=16, policy="fifo", placement="framework", sharp_leaf_share=share)
        runs[share] = {o.id: o for o in simulate(trace, config).outcomes}
    assert not any(o.sharp for o in runs[0.0].values())
    assert all(o.sharp for o in runs[1.0].values())
    sharp_stretch = CostModel().stretch(hosts=4, leaves=1, min_leaves=1, sharp=True)
    for job_id, o in runs[1.0].items():
        assert o.end_s - o.first_start_s == pytest.approx(1000.0 * sharp_stretch)
        assert runs[0.0][job_id].end_s - runs[0.0][job_id].first_start_s == pytest.approx(1000.0)
    with pytest.raises(ValueError, match="sharp_leaf_share"):
        simulate(trace, SimConfig(nodes=16, placement="framework", sharp_leaf_share=1.5))


def test_philly_slice_under_every_policy_keeps_the_invariants() -> None:
    trace = philly_trace_jobs(need("traces/philly/philly.csv"), limit=1500)
    assert len(trace) == 1500
    summaries = []
    for entry in LINEUP:
        result = simulate(trace, config_for(entry, RunOptions(nodes=24)))
        assert_sane(result, trace)
        summaries.append(result.summary())
    by = {s["policy"]: float(s["avg_jct_s"]) for s in summaries}
    # Oracle SJF can only help over strict FIFO; the checks run and name every floor.
    assert by["oracle-sjf"] <= by["fifo"]
    assert len(check_floors(summaries, 80)) >= 2


def test_runs_are_reproducible_by_seed() -> None:
    trace = synthetic(200)
    failures = random_failures(7, 5, 6, trace[-1].submit_s)
    assert failures == random_failures(7, 5, 6, trace[-1].submit_s)
    assert failures != random_failures(8, 5, 6, trace[-1].submit_s)
    config = SimConfig(nodes=6, policy="las", cycle=CycleConfig(backfill="greedy"), failures=failures)
    first, second = simulate(trace, config), simulate(trace, config)
    assert first.outcomes == second.outcomes
    assert_sane(first, trace)


def test_a_failed_host_requeues_its_jobs_and_they_rerun_in_full() -> None:
    trace = [TraceJob(id="a", tenant="t", gpus=8, submit_s=0.0, duration_s=1000.0)]
    config = SimConfig(nodes=2, policy="fifo", failures=[HostFailure(host=0, at_s=500.0, down_s=100.0)])
    (outcome,) = simulate(trace, config).outcomes
    assert outcome.preemptions == 1
    # Restarted at 500 on the other host from the beginning, plus the restore cost.
    assert outcome.end_s == pytest.approx(500.0 + 60.0 + 1000.0)


def test_preempted_jobs_pay_the_checkpoint_restore_cost_once_per_restart() -> None:
    trace = [
        TraceJob(id="long", tenant="t", gpus=8, submit_s=0.0, duration_s=10_000.0),
        TraceJob(id="short", tenant="t", gpus=8, submit_s=1000.0, duration_s=100.0),
    ]
    result = simulate(trace, SimConfig(nodes=1, policy="oracle-srtf", cycle=CycleConfig(backfill="greedy")))
    end = {o.id: o for o in result.outcomes}
    assert end["short"].end_s == pytest.approx(1100.0)
    assert end["long"].preemptions == 1
    assert end["long"].end_s == pytest.approx(10_000.0 + 100.0 + 60.0)


def test_allreduce_cost_model_stretches_only_gangs_spread_past_their_minimal_span() -> None:
    cost = CostModel()
    assert cost.stretch(hosts=2, leaves=1, min_leaves=1) == 1.0
    assert cost.stretch(hosts=2, leaves=2, min_leaves=1) == pytest.approx(0.7 + 0.3 * 2.0)
    assert cost.stretch(hosts=16, leaves=3, min_leaves=2) == 1.0
    # t = (S / B) * 2(n-1)/n: 1 GB over 8 hosts at 200 Gb/s.
    assert cost.allreduce_s(1e9, 8, 1) == pytest.approx(1e9 / 25e9 * 2 * 7 / 8)
    # SHARP: every host sends and receives S once, t = S / B; for 2 hosts the ring does the same.
    assert cost.allreduce_s(1e9, 8, 1, sharp=True) == pytest.approx(1e9 / 25e9)
    assert cost.stretch(hosts=2, leaves=1, min_leaves=1, sharp=True) == pytest.approx(1.0)
    assert cost.stretch(hosts=8, leaves=1, min_leaves=1, sharp=True) == pytest.approx(0.7 + 0.3 * 8 / 14)


def test_learned_gittins_learns_only_from_jobs_that_ended() -> None:
    from ibpool_core.sched.queueing import LearnedGittins

    trace = synthetic(60)
    policy = LearnedGittins(service="time")
    config = SimConfig(nodes=6, policy="gittins-learned", cycle=CycleConfig(backfill="greedy"))
    result = simulate(trace, config, policy=policy)
    assert_sane(result, trace)
    # One observation per job that ended, fed by the simulator as it ended.
    assert policy.history.version == len(trace)
    assert sorted(policy.history.samples("t0", 1)) == sorted(
        t.duration_s for t in trace if t.tenant == "t0" and t.gpus == 1
    )


def test_1d_las_demotes_a_gang_by_seconds_run_not_gpu_seconds() -> None:
    # An 8-GPU job that ran 1,000 s is in queue 1 by GPU-time (8,000 > 3,600) and is preempted by a
    # newcomer; by time (1,000 < 3,600) it is not.
    trace = [
        TraceJob(id="gang", tenant="t", gpus=8, submit_s=0.0, duration_s=2000.0),
        TraceJob(id="new", tenant="t", gpus=8, submit_s=1000.0, duration_s=100.0),
    ]
    ends = {}
    for service in ("gpu-time", "time"):
        config = SimConfig(
            nodes=1,
            policy="las",
            policy_params={"thresholds": [3600.0], "service": service},
            cycle=CycleConfig(backfill="greedy"),
        )
        ends[service] = {o.id: o.end_s for o in simulate(trace, config).outcomes}
    assert ends["gpu-time"]["new"] == pytest.approx(1100.0)
    assert ends["time"]["new"] == pytest.approx(2100.0)


@pytest.mark.parametrize("policy", ["priority", "las", "gittins-learned"])
def test_a_stepped_loop_fed_arrivals_as_they_come_is_simulate(policy: str) -> None:
    # The cells simulation's way of running `SimLoop` (arrivals pushed when their instant comes, after
    # that instant's ends, failures and recoveries) gives simulate()'s run, with host failures, LAS
    # demotions and fair-share refreshes (priority), to the last bit.
    trace = synthetic(200)
    config = SimConfig(
        nodes=6,
        policy=policy,
        cycle=CycleConfig(backfill="greedy"),
        failures=random_failures(7, 5, 6, trace[-1].submit_s),
    )
    pending = list(trace)

    class Fed(SimLoop):
        def more_to_come(self) -> bool:
            return bool(pending)

    loop = Fed(
        config,
        make_sim_policy(config, trace),
        tenants=sorted({t.tenant for t in trace}),
        first_submit=trace[0].submit_s,
        jobs=len(trace),
    )
    while True:
        now = min(loop.next_at(), pending[0].submit_s if pending else math.inf)
        if now == math.inf:
            break
        loop.handle(now, before_arrivals=True)
        while pending and pending[0].submit_s == now:
            loop.arrive(pending.pop(0), now)
        loop.handle(now)
        loop.cycle(now)
    stepped, whole = loop.result(policy, 0.0, 0.0), simulate(trace, config)
    assert stepped.outcomes == whole.outcomes and stepped.cycles == whole.cycles
    assert stepped.busy_gpu_s == whole.busy_gpu_s
    assert sum(o.preemptions for o in whole.outcomes) > 0
