"""Two sites, one trace: routing each job by the scheduler's `choose_site` against sending it to the
first site it names and against a load balancer blind to runtimes and data."""

from __future__ import annotations

import random

import pytest

from ibpool_sim.sites_sim import TwoSiteConfig, simulate_two_sites
from ibpool_sim.traces import TraceJob

# Two sites of 6 hosts x 8 GPUs; a job copies its dataset to b in 120 s; runtimes known exactly.
SMALL = TwoSiteConfig(nodes=(6, 6), transfer_s=120.0, exact_runtimes=True)


def poisson_trace(seed: int, n: int = 300) -> list[TraceJob]:
    """Jobs every 40 s on average, 1-16 GPUs, 100-1,500 s."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(1 / 40.0)
        gpus = rng.choice([1, 2, 4, 8, 8, 16])
        out.append(TraceJob(id=f"j{i:03d}", tenant="t", gpus=gpus, submit_s=t, duration_s=rng.uniform(100, 1500)))
    return out


def test_choosing_by_estimated_start_beats_the_first_site_and_copies_less_data_than_balancing() -> None:
    trace = poisson_trace(7)
    first = simulate_two_sites(trace, "first", SMALL)
    balanced = simulate_two_sites(trace, "most-free", SMALL)
    chosen = simulate_two_sites(trace, "choose", SMALL)
    assert first.placed == {"a": 300, "b": 0} and first.copies == 0
    assert chosen.placed["a"] > 0 and chosen.placed["b"] > 0
    assert chosen.avg_jct_s < 0.5 * first.avg_jct_s, (chosen, first)
    assert chosen.copies < balanced.copies, (chosen, balanced)
    assert simulate_two_sites(trace, "choose", SMALL) == chosen  # reproducible


def test_bad_strategy_and_jobs_too_big_for_a_site_are_errors() -> None:
    trace = poisson_trace(1, n=5)
    with pytest.raises(ValueError, match="unknown strategy 'random'"):
        simulate_two_sites(trace, "random", SMALL)
    big = [TraceJob(id="huge", tenant="t", gpus=64, submit_s=0.0, duration_s=1.0)]
    with pytest.raises(ValueError, match="more hosts than either site has"):
        simulate_two_sites(big, "choose", SMALL)
