"""Multi-site: the site by estimated start and data locality, and a two-site simulation in which
choosing by estimated start beats sending every job to the first site it names."""

from __future__ import annotations

import heapq
import random
import statistics

import pytest

from ibpool_core.sched.cycle import CycleConfig, SchedulingRequest, schedule
from ibpool_core.sched.jobs import ClusterView, Job, RunningJob
from ibpool_core.sched.queueing import make_policy
from ibpool_core.sched.sites import Site, choose_site, estimate_start


def cluster(hosts: int, gpus: int = 8) -> ClusterView:
    return ClusterView(free=[gpus] * hosts, capacity=[gpus] * hosts, leaf_of=[0] * hosts)


def job(job_id: str, gpus: int, runtime: float = 100.0, nodes: int = 1, submit: float = 0.0) -> Job:
    return Job(id=job_id, tenant="t", gpus=gpus, nodes=nodes, submit_time=submit, requested_runtime_s=runtime)


def busy(hosts: int, until: float) -> tuple[ClusterView, list[RunningJob]]:
    c = ClusterView(free=[0] * hosts, capacity=[8] * hosts, leaf_of=[0] * hosts)
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


# -- a two-site simulation ----------------------------------------------------------------------------


def two_site_sim(strategy: str, seed: int = 7, n: int = 300) -> tuple[float, dict[str, int], int]:
    """Jobs arrive (Poisson), name sites [a, b] (a first: everyone's favourite), half read a dataset
    held only at a (moving it to b costs `transfer`, charged to the job's runtime there). Each site
    runs its own `schedule()` (fifo, EASY backfill). `strategy`: "first" sends every job to the
    first site it names; "most-free" to the site with the most free GPUs less those its queue
    waits for; "choose" uses `choose_site`. Returns the mean JCT, jobs per site and how many jobs
    had their dataset moved."""
    rng = random.Random(seed)
    transfer = 120.0
    sizes = {"a": 6, "b": 6}
    datasets = {"a": frozenset({"ds"}), "b": frozenset()}
    t, arrivals = 0.0, []
    for i in range(n):
        t += rng.expovariate(1 / 40.0)
        gpus = rng.choice([1, 2, 4, 8, 8, 16])
        runtime = rng.uniform(100, 1500)
        arrivals.append((t, job(f"j{i:03d}", gpus, runtime, nodes=max(1, gpus // 8), submit=t), rng.random() < 0.5))
    free = {s: [8] * sizes[s] for s in sizes}
    running: dict[str, list[RunningJob]] = {s: [] for s in sizes}
    queue: dict[str, list[Job]] = {s: [] for s in sizes}
    ends: list[tuple[float, str, str]] = []
    runtime_at: dict[str, float] = {}
    finished: dict[str, float] = {}
    placed: dict[str, int] = {s: 0 for s in sizes}
    moved = 0
    i = 0
    policy = make_policy("fifo")
    while len(finished) < n:
        now = min(arrivals[i][0] if i < n else float("inf"), ends[0][0] if ends else float("inf"))
        while ends and ends[0][0] <= now:
            _, s, jid = heapq.heappop(ends)
            run = next(r for r in running[s] if r.job.id == jid)
            running[s].remove(run)
            for h, g in run.hosts:
                free[s][h] += g
            finished[jid] = now
        while i < n and arrivals[i][0] <= now:
            _, j, reads = arrivals[i]
            i += 1
            if strategy == "first":
                site = "a"
            elif strategy == "most-free":  # the site with the most free GPUs now, blind to queues and data
                site = max(("a", "b"), key=lambda x: (sum(free[x]) - sum(q.gpus for q in queue[x]), x == "a"))
            else:
                views = [
                    Site(
                        name=s,
                        cluster=ClusterView(free=list(free[s]), capacity=[8] * sizes[s], leaf_of=[0] * sizes[s]),
                        running=running[s],
                        queue=queue[s],
                        datasets=datasets[s],
                    )
                    for s in ("a", "b")
                ]
                chosen = choose_site(j, views, now, dataset="ds" if reads else None, transfer_s=transfer)
                assert chosen.site is not None
                site = chosen.site
            move = reads and "ds" not in datasets[site]
            moved += move
            runtime_at[j.id] = j.requested_runtime_s + (transfer if move else 0.0)  # type: ignore[operator]
            queue[site].append(j)
            placed[site] += 1
        for s in sizes:
            if not queue[s]:
                continue
            reply = schedule(
                SchedulingRequest(
                    now=now,
                    queue=queue[s],
                    running=running[s],
                    cluster=ClusterView(free=free[s], capacity=[8] * sizes[s], leaf_of=[0] * sizes[s]),
                    policy=policy,
                    config=CycleConfig(explain=False),
                )
            )
            by_id = {j.id: j for j in queue[s]}
            for start in reply.starts:
                j = by_id[start.job_id]
                for h, g in start.hosts:
                    free[s][h] -= g
                end = now + runtime_at[j.id]
                running[s].append(
                    RunningJob(job=j, hosts=tuple(start.hosts), started_at=now, planned_end=start.planned_end)
                )
                heapq.heappush(ends, (end, s, j.id))
            started = {st.job_id for st in reply.starts}
            queue[s] = [j for j in queue[s] if j.id not in started]
    jct = statistics.fmean(finished[j.id] - j.submit_time for _, j, _ in arrivals)
    return jct, placed, moved


def test_two_sites_choosing_by_start_and_locality_beats_the_first_site_and_moves_less_data() -> None:
    first, placed_first, _ = two_site_sim("first")
    _, _, moved_most_free = two_site_sim("most-free")
    chosen, placed_chosen, moved_chosen = two_site_sim("choose")
    assert placed_first == {"a": 300, "b": 0}
    assert placed_chosen["b"] > 0 and placed_chosen["a"] > 0
    assert chosen < 0.5 * first, (chosen, first)
    # Against a load balancer blind to data the mean JCT is about the same (within 2% on seeds 7-9)
    # and fewer jobs wait for their dataset to be copied (61 against 77 on seed 7).
    assert moved_chosen < moved_most_free, (moved_chosen, moved_most_free)
    assert two_site_sim("choose") == (chosen, placed_chosen, moved_chosen)  # reproducible
