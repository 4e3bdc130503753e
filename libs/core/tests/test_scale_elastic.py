"""Batch elasticity: elastic jobs grow into idle GPUs and shrink for higher-priority waiting work."""

from __future__ import annotations

import pytest

from ibpool_core.scale.elastic import ElasticityRequest, ElasticJob, WaitingWork, decide_elasticity


def job(job_id: str, workers: int, lo: int, hi: int, priority: int = 0, gpus: int = 1) -> ElasticJob:
    return ElasticJob(
        job_id=job_id, workers=workers, min_workers=lo, max_workers=hi, priority=priority, gpus_per_worker=gpus
    )


def work(work_id: str, gpus: int, priority: int) -> WaitingWork:
    return WaitingWork(work_id=work_id, gpus=gpus, priority=priority)


@pytest.mark.parametrize(
    ("name", "request_", "want", "idle_left"),
    [
        ("grows into idle GPUs up to max", ElasticityRequest(idle_gpus=10, jobs=[job("a", 2, 1, 6)]), {"a": 6}, 6),
        ("grows by what is idle", ElasticityRequest(idle_gpus=3, jobs=[job("a", 2, 1, 8)]), {"a": 5}, 0),
        ("whole workers only", ElasticityRequest(idle_gpus=7, jobs=[job("a", 1, 1, 8, gpus=4)]), {"a": 2}, 3),
        (
            "higher priority grows first",
            ElasticityRequest(idle_gpus=4, jobs=[job("low", 1, 1, 8, 1), job("high", 1, 1, 8, 5)]),
            {"high": 5},
            0,
        ),
        ("nothing idle: nothing grows", ElasticityRequest(idle_gpus=0, jobs=[job("a", 2, 1, 6)]), {}, 0),
        (
            "idle GPUs go to waiting work first",
            ElasticityRequest(idle_gpus=6, jobs=[job("a", 2, 1, 6, 1)], waiting=[work("w", 4, 5)]),
            {"a": 4},
            0,
        ),
        (
            "shrinks for higher-priority waiting work",
            ElasticityRequest(idle_gpus=1, jobs=[job("a", 6, 2, 8, 1)], waiting=[work("w", 4, 5)]),
            {"a": 3},
            0,
        ),
        (
            "never below min_workers: the next job gives the rest",
            ElasticityRequest(
                idle_gpus=0, jobs=[job("a", 3, 2, 8, 1), job("b", 5, 1, 8, 2)], waiting=[work("w", 4, 5)]
            ),
            {"a": 2, "b": 2},
            0,
        ),
        (
            "lowest priority shrinks first",
            ElasticityRequest(
                idle_gpus=0, jobs=[job("mid", 6, 1, 8, 3), job("low", 6, 1, 8, 1)], waiting=[work("w", 2, 5)]
            ),
            {"low": 4},
            0,
        ),
        (
            "equal priority does not shrink",
            ElasticityRequest(idle_gpus=0, jobs=[job("a", 6, 1, 8, 5)], waiting=[work("w", 2, 5)]),
            {},
            0,
        ),
        (
            "lower-priority waiting work neither shrinks nor blocks growth",
            ElasticityRequest(idle_gpus=2, jobs=[job("a", 2, 1, 8, 5)], waiting=[work("w", 8, 1)]),
            {"a": 4},
            0,
        ),
        (
            "a shortfall shrinking cannot cover shrinks nothing and holds the idle GPUs",
            ElasticityRequest(idle_gpus=2, jobs=[job("a", 3, 2, 8, 1)], waiting=[work("w", 8, 5)]),
            {},
            2,
        ),
        (
            "multi-GPU workers: freed GPUs round up to whole workers, the rest stays idle",
            ElasticityRequest(idle_gpus=0, jobs=[job("a", 4, 1, 4, 1, gpus=4)], waiting=[work("w", 6, 5)]),
            {"a": 2},
            2,
        ),
    ],
)
def test_elasticity(name: str, request_: ElasticityRequest, want: dict[str, int], idle_left: int) -> None:
    reply = decide_elasticity(request_)
    got = {c.job_id: c.workers_to for c in reply.changes}
    assert got == want, (name, reply)
    assert reply.idle_left == idle_left, name


def test_the_reply_says_for_whom_a_job_shrank_and_what_it_reserved() -> None:
    reply = decide_elasticity(
        ElasticityRequest(idle_gpus=1, jobs=[job("train", 6, 2, 8, 1)], waiting=[work("serve", 4, 5)])
    )
    (change,) = reply.changes
    assert change.delta == -3 and "serve" in change.reason
    assert reply.reserved == {"serve": 4}
    assert reply.unmet == []


def test_a_job_shrunk_for_waiting_work_does_not_grow_back_in_the_same_decision() -> None:
    # small gives its 9 spare GPUs, big a whole 4-GPU worker for the last 2: 2 GPUs are left over,
    # which small must not take back
    reply = decide_elasticity(
        ElasticityRequest(
            idle_gpus=0, jobs=[job("small", 10, 1, 12, 1), job("big", 2, 1, 2, 1, gpus=4)], waiting=[work("w", 11, 5)]
        )
    )
    assert {c.job_id: c.workers_to for c in reply.changes} == {"small": 1, "big": 1}
    assert reply.reserved == {"w": 11}
    assert reply.idle_left == 2


def test_unmet_work_is_named() -> None:
    reply = decide_elasticity(ElasticityRequest(idle_gpus=2, jobs=[job("low", 2, 1, 8, 1)], waiting=[work("v", 4, 0)]))
    assert reply.unmet == ["v"]
    # v is less important than low: low does not shrink for it and may take the idle GPUs
    assert [(c.job_id, c.workers_to) for c in reply.changes] == [("low", 4)]


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="min_workers"):
        job("a", 9, 1, 8)
