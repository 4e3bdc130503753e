"""Submit-time features see only jobs that finished strictly before the submit: no future leakage."""

from __future__ import annotations

import math
import random

from ibpool_predict.contract import JobFeatures
from ibpool_predict.history import FEATURE_NAMES, SCOPE_STATS, SCOPES, FinishedJobHistory


def _col(scope: str, stat: str) -> int:
    return FEATURE_NAMES.index(f"{scope}.{stat}")


def _same(a: list[float], b: list[float]) -> bool:
    return all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b, strict=True))


def test_a_job_still_running_at_submit_is_invisible() -> None:
    h = FinishedJobHistory()
    long = JobFeatures(tenant="a", num_gpus=1, submit_time=0.0)
    h.add(long, runtime_s=100.0, finished_at=100.0)
    during = JobFeatures(tenant="a", num_gpus=1, submit_time=50.0)
    at_finish = JobFeatures(tenant="a", num_gpus=1, submit_time=100.0)
    after = JobFeatures(tenant="a", num_gpus=1, submit_time=100.5)
    count = _col("tenant", "log_count")
    assert h.features_at(during)[count] == 0.0
    assert h.features_at(at_finish)[count] == 0.0, "finishing at the submit instant is not before it"
    assert h.features_at(after)[count] == math.log1p(1)
    assert h.features_at(after)[_col("tenant", "last")] == math.log(100.0)


def test_features_equal_those_of_a_history_holding_only_the_past() -> None:
    rng = random.Random(7)
    stream = []
    for _ in range(400):
        submit = rng.uniform(0, 10_000)
        job = JobFeatures(
            tenant=rng.choice("abc"), num_gpus=rng.choice([1, 2, 8]), submit_time=submit, name=rng.choice([None, "x"])
        )
        stream.append((job, rng.uniform(1, 2_000)))
    everything = FinishedJobHistory()
    trimmed = FinishedJobHistory(keep_per_key=60)  # holds 60 to 120 entries per key: the trimming path runs
    for job, runtime in sorted(stream, key=lambda s: s[0].submit_time + s[1]):
        everything.add(job, runtime, job.submit_time + runtime)
        trimmed.add(job, runtime, job.submit_time + runtime)
    unknown = 0
    for job, _ in stream[:100]:
        past_only = FinishedJobHistory()
        for other, runtime in stream:
            if other.submit_time + runtime < job.submit_time:
                past_only.add(other, runtime, other.submit_time + runtime)
        truth = past_only.features_at(job)
        assert _same(everything.features_at(job), truth), job
        mine = trimmed.features_at(job)
        for scope in SCOPES:
            cols = [_col(scope, stat) for stat in SCOPE_STATS]
            if all(math.isnan(mine[i]) for i in cols) and not all(math.isnan(truth[i]) for i in cols):
                unknown += 1  # asked about a time before what the trimmed history holds: it says so
                continue
            # Counts and all-time means cover everything finished before the submit, never more.
            for i in (_col(scope, "log_count"), _col(scope, "mean_all")):
                assert _same([mine[i]], [truth[i]]) or math.isclose(mine[i], truth[i], rel_tol=1e-9), (job, scope)
    assert 0 < unknown < 100 * len(SCOPES) / 2


def test_out_of_order_finishes_give_the_same_features() -> None:
    jobs = [
        (JobFeatures(tenant="a", num_gpus=1, submit_time=float(t)), float(r)) for t, r in [(0, 30), (5, 10), (9, 2)]
    ]
    in_order, reversed_order = FinishedJobHistory(), FinishedJobHistory()
    for job, r in sorted(jobs, key=lambda j: j[0].submit_time + j[1]):
        in_order.add(job, r, job.submit_time + r)
    for job, r in reversed(jobs):
        reversed_order.add(job, r, job.submit_time + r)
    for t in (10.0, 15.0, 31.0):
        probe = JobFeatures(tenant="a", num_gpus=1, submit_time=t)
        assert _same(in_order.features_at(probe), reversed_order.features_at(probe))


def test_row_has_one_value_per_feature_name() -> None:
    job = JobFeatures(tenant="a", num_gpus=4, submit_time=1_700_000_000.0, requested_limit_s=3_600.0, name="bert")
    assert len(FinishedJobHistory().features_at(job)) == len(FEATURE_NAMES) == 4 + len(SCOPES) * len(SCOPE_STATS)


def test_rows_asked_between_additions_equal_those_of_a_history_built_afresh() -> None:
    """Asked again after appends, out-of-order inserts and trims, a row is what a fresh history says."""
    rng = random.Random(13)
    live = FinishedJobHistory(keep_per_key=15)  # trims after 30 entries per key
    added: list[tuple[JobFeatures, float, float]] = []
    clock, asked = 0.0, 0
    for k in range(240):
        clock += rng.uniform(0, 20)
        finished = clock - (rng.uniform(0, 200) if k % 5 == 0 else 0.0)  # every 5th out of finish order
        job = JobFeatures(tenant=rng.choice("ab"), num_gpus=rng.choice([1, 2]), submit_time=finished - 5.0)
        runtime = rng.uniform(1, 500)
        live.add(job, runtime, finished)
        added.append((job, runtime, finished))
        fresh = FinishedJobHistory(keep_per_key=15)
        for j, r, f in added:
            fresh.add(j, r, f)
        for back in (0.0, 10.0, 25.0, 50.0, 100.0, -1.0):
            probe = JobFeatures(tenant=rng.choice("ab"), num_gpus=rng.choice([1, 2]), submit_time=clock - back)
            assert _same(live.features_at(probe), fresh.features_at(probe)), (k, probe)
            asked += 1
    assert asked == 240 * 6


def test_free_text_names_do_not_grow_the_history_without_bound() -> None:
    # One name per job (a run id in it): past max_keys the name added to longest ago is forgotten,
    # a name seen again is kept, and the other scopes still count every job.
    h = FinishedJobHistory(max_keys=3)
    for i in range(5):
        h.add(JobFeatures(tenant="a", num_gpus=1, submit_time=0.0, name=f"run-{i}"), 10.0, finished_at=float(i))
        if i == 2:
            h.add(JobFeatures(tenant="a", num_gpus=1, submit_time=0.0, name="run-0"), 10.0, finished_at=2.5)
    named = _col("tenant_name", "log_count")

    def count_of(name: str) -> float:
        return h.features_at(JobFeatures(tenant="a", num_gpus=1, submit_time=100.0, name=name))[named]

    assert [count_of(f"run-{i}") for i in range(5)] == [math.log1p(2), 0.0, 0.0, math.log1p(1), math.log1p(1)]
    assert h.features_at(JobFeatures(tenant="a", num_gpus=1, submit_time=100.0))[_col("tenant", "log_count")] == (
        math.log1p(6)
    )
