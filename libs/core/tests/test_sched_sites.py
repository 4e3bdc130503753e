"""Multi-site: the site by estimated start and data locality (the two-site simulation that measures
it is libs/sim/ibpool_sim/sites_sim.py)."""

from __future__ import annotations

import pytest

from ibpool_core.sched.jobs import FreeCapacity, Job, RunningJob
from ibpool_core.sched.sites import Site, choose_site, estimate_start


def cluster(hosts: int, gpus: int = 8) -> FreeCapacity:
    return FreeCapacity(free=[gpus] * hosts, capacity=[gpus] * hosts, leaf_of=[0] * hosts)


def job(job_id: str, gpus: int, runtime: float = 100.0, nodes: int = 1, submit: float = 0.0) -> Job:
    return Job(id=job_id, tenant="t", gpus=gpus, hosts=nodes, submit_time=submit, requested_runtime_s=runtime)


def busy(hosts: int, until: float) -> tuple[FreeCapacity, list[RunningJob]]:
    c = FreeCapacity(free=[0] * hosts, capacity=[8] * hosts, leaf_of=[0] * hosts)
    running = [
        RunningJob(job=job(f"r{h}", 8), hosts=((h, 8),), started_at=0.0, planned_end=until) for h in range(hosts)
    ]
    return c, running


def test_estimate_counts_running_jobs_and_the_queue_ahead() -> None:
    c, running = busy(2, until=500.0)
    site = Site(name="a", cluster=c, running=running)
    assert estimate_start(site, job("j", 8), 0.0) == 500.0
    ahead = Site(name="a", cluster=c, running=running, queue=[job("q1", 16, runtime=200.0, nodes=2)])
    assert estimate_start(ahead, job("j", 8), 0.0) == 500.0 + 200.0  # a requested runtime takes no margin
    assert estimate_start(Site(name="a", cluster=cluster(1)), job("big", 16, nodes=2), 0.0) is None
    assert estimate_start(Site(name="a", cluster=cluster(2)), job("now", 8), 42.0) == 42.0


@pytest.mark.parametrize(
    ("a_until", "transfer", "dataset", "expect"),
    [
        (0.0, 0.0, None, "a"),  # both free now: the first named
        (300.0, 0.0, None, "b"),  # a is busy: b starts it sooner
        (300.0, 600.0, "imagenet", "a"),  # b would start it sooner, but the data is at a and moving it costs more
        (300.0, 100.0, "imagenet", "b"),  # moving the data is cheaper than waiting
    ],
)
def test_choose_by_estimated_start_and_data_locality(
    a_until: float, transfer: float, dataset: str | None, expect: str
) -> None:
    a_cluster, a_running = busy(2, a_until) if a_until else (cluster(2), [])
    a = Site(name="a", cluster=a_cluster, running=a_running, datasets=frozenset({"imagenet"}))
    b = Site(name="b", cluster=cluster(2))
    choice = choose_site(job("j", 8), [a, b], 0.0, dataset=dataset, transfer_s=transfer)
    assert choice.site == expect, choice
    assert set(choice.estimates) == {"a", "b"}
    if dataset is not None:
        assert ("holds its dataset" in choice.reason) == (expect == "a")


def test_a_job_that_fits_no_site_says_so_and_bad_site_lists_are_errors() -> None:
    choice = choose_site(job("j", 64, nodes=8), [Site(name="a", cluster=cluster(2))], 0.0)
    assert (choice.site, choice.reason) == (None, "fits none of the sites it names")
    with pytest.raises(ValueError, match="names no site"):
        choose_site(job("j", 1), [], 0.0)
    with pytest.raises(ValueError, match="named twice"):
        choose_site(job("j", 1), [Site(name="a", cluster=cluster(1))] * 2, 0.0)


def test_a_site_whose_jobs_overran_their_plan_is_not_taken_for_free() -> None:
    # Both of a's hosts are held by jobs planned to end at 100 s that are still running at 1,000 s:
    # expected to run as long again (to 2,000 s), so b, free at 1,500 s, starts the job first.
    c, running = busy(2, until=100.0)
    a = Site(name="a", cluster=c, running=running)
    b_cluster, b_running = busy(2, until=1500.0)
    b = Site(name="b", cluster=b_cluster, running=b_running)
    assert estimate_start(a, job("j", 8), 1000.0) == 2000.0
    assert choose_site(job("j", 8), [a, b], 1000.0).site == "b"


def test_a_job_that_fits_beside_a_blocked_head_starts_now_and_a_long_queue_counts_past_the_depth() -> None:
    site = Site(name="a", cluster=cluster(2), queue=[job("head", 24, nodes=3)])
    assert estimate_start(site, job("small", 8), 5.0) == 5.0  # backfilled beside the head that never fits
    long = Site(name="a", cluster=cluster(1), queue=[job(f"q{i}", 8, runtime=100.0) for i in range(10)])
    # depth 4: four list-scheduled (400 s), six more behind them spread over the site's 8 GPUs (600 s)
    assert estimate_start(long, job("j", 8), 0.0, depth=4) == 400.0 + 600.0
