"""The inference simulator: the trace generator, the queue model, and runs reproducible by seed."""

from __future__ import annotations

import argparse
import json
import math

import msgspec
import pytest

from ibpool_sim import inference_sim as sim

ONE_DAY = sim.TraceConfig(days=1, burst_day=0)
# A short run: one day with its burst, so the tests take about a second.
SHORT = sim.SimConfig(trace=ONE_DAY)


def test_trace_is_reproducible_by_seed() -> None:
    assert sim.generate_trace(3) == sim.generate_trace(3)
    assert sim.generate_trace(3).rates != sim.generate_trace(4).rates


def test_trace_is_diurnal_with_a_burst_on_day_three() -> None:
    trace = sim.generate_trace(0)
    day = 1440
    assert len(trace.rates) == 3 * day
    assert trace.burst_start_s is not None and 2 * 86400 + 10 * 3600 <= trace.burst_start_s <= 2 * 86400 + 18 * 3600
    first = trace.rates[:day]
    trough, peak = min(first[3 * 60 : 5 * 60]), max(first[15 * 60 : 17 * 60])
    assert peak > 5 * trough  # the night is much quieter than the afternoon
    b = int(trace.burst_start_s // 60)
    burst = trace.rates[b + 3 : b + 20]
    same_time_day_two = trace.rates[b + 3 - day : b + 20 - day]
    assert sum(burst) > 1.6 * sum(same_time_day_two)


def test_without_a_burst_day_there_is_no_burst() -> None:
    trace = sim.generate_trace(0, msgspec.structs.replace(sim.TraceConfig(), burst_day=-1))
    assert trace.burst_start_s is None


@pytest.mark.parametrize(("rho", "servers"), [(0.5, 1), (0.8, 1), (0.9, 1)])
def test_mm1_p99_wait_matches_the_closed_form(rho: float, servers: int) -> None:
    # M/M/1: P(wait > t) = rho * exp(-(mu - lambda) t)
    mu = 2.0
    want = math.log(rho / 0.01) / (mu - rho * mu)
    assert sim.p99_wait_s(servers, mu, rho * mu) == pytest.approx(want)
    assert sim.erlang_c(1, rho) == pytest.approx(rho)


def test_many_servers_at_moderate_load_do_not_wait() -> None:
    assert sim.p99_wait_s(400, 1.25, 0.6 * 400 * 1.25) == 0.0
    assert sim.p99_wait_s(4, 1.25, 6.0) == math.inf


def test_a_run_is_reproducible_by_seed() -> None:
    a = sim.simulate("reactive", 1, SHORT, keep_series=True)
    b = sim.simulate("reactive", 1, SHORT, keep_series=True)
    assert a == b
    assert a.minutes == 1440
    assert a.gpu_hours > 0 and a.max_replicas > 1
    assert a.scale_ups > 0 and a.scale_downs > 0


def test_the_burst_costs_slo_minutes_and_replicas_follow_the_load() -> None:
    r = sim.simulate("reactive", 2, SHORT, keep_series=True)
    assert r.burst_violation_minutes > 0
    assert r.burst_violation_minutes <= r.slo_violation_minutes
    rate, held = r.series["rate"], r.series["replicas"]
    # afternoon vs night: the service scaled with its load
    assert sum(held[15 * 60 : 16 * 60]) > 3 * sum(held[3 * 60 : 4 * 60])
    assert sum(rate[15 * 60 : 16 * 60]) > 3 * sum(rate[3 * 60 : 4 * 60])


def test_too_few_replicas_violate_and_enough_do_not() -> None:
    flat = msgspec.structs.replace(ONE_DAY, trough_rps=100.0, peak_rps=100.0, noise_sigma=0.0, burst_day=-1)
    dep = msgspec.structs.replace(SHORT.deployment, min_replicas=5, max_replicas=5)
    # 5 replicas x 10 requests/s = 50 < 100: the queue grows all day
    starved = sim.simulate("reactive", 0, msgspec.structs.replace(SHORT, trace=flat, deployment=dep))
    assert starved.slo_violation_minutes > 1400
    roomy = msgspec.structs.replace(dep, min_replicas=14, max_replicas=14)
    fine = sim.simulate("reactive", 0, msgspec.structs.replace(SHORT, trace=flat, deployment=roomy))
    assert fine.slo_violation_minutes == 0
    assert fine.gpu_hours == pytest.approx(14 * 24)


def test_summary_checks_the_floor() -> None:
    def result(policy: str, seed: int, violations: int, gpu_hours: float) -> sim.RunResult:
        return sim.RunResult(
            policy=policy,
            seed=seed,
            slo_violation_minutes=violations,
            gpu_hours=gpu_hours,
            minutes=10,
            mean_replicas=1.0,
            max_replicas=1,
            scale_ups=0,
            scale_downs=0,
            burst_violation_minutes=0,
        )

    met = sim.summarise([result("reactive", 0, 10, 100.0), result("predictive", 0, 5, 109.0)])
    assert met["floor"]["met"] and met["floor"]["seeds_fewer_violations"] == 1
    costly = sim.summarise([result("reactive", 0, 10, 100.0), result("predictive", 0, 5, 111.0)])
    assert not costly["floor"]["met"]
    no_better = sim.summarise([result("reactive", 0, 10, 100.0), result("predictive", 0, 10, 100.0)])
    assert not no_better["floor"]["met"]


def test_cli_prints_json_per_run_and_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser()
    sim.add_arguments(p)
    args = p.parse_args(["--policy", "reactive", "--seed", "5", "--format", "json"])
    assert sim.run_from_args(args, SHORT) == 0
    body = json.loads(capsys.readouterr().out)
    assert [r["seed"] for r in body["runs"]] == [5]
    assert body["summary"]["policies"]["reactive"]["mean_gpu_hours"] > 0


def test_cli_refuses_an_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser()
    sim.add_arguments(p)
    assert sim.run_from_args(p.parse_args(["--policy", "psychic"]), SHORT) == 2
    assert "unknown policy" in capsys.readouterr().err


def test_variant_flags_change_only_what_they_name() -> None:
    p = argparse.ArgumentParser()
    sim.add_arguments(p)
    assert sim.config_from_args(p.parse_args([])) == sim.DEFAULT_SIM
    cfg = sim.config_from_args(
        p.parse_args(["--target-rps", "7", "--cold-start-s", "300", "--noise-sigma", "0.1", "--no-burst"])
    )
    assert cfg.deployment.target_of("requests_per_s") == 7.0
    assert cfg.deployment.cold_start_s == 300.0
    assert cfg.trace.noise_sigma == 0.1 and cfg.trace.burst_day == -1
    assert cfg.policy.predictive.error_headroom
    assert not sim.config_from_args(p.parse_args(["--no-error-headroom"])).policy.predictive.error_headroom
