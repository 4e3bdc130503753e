"""Why a job waits, typed (`waits.Wait`): each code from the cycle, and the words rendered from it."""

from __future__ import annotations

import pytest

from ibpool_core.sched.waits import Wait, clock_text
from libs.core.tests.sched_builders import cluster, job, run_cycle, running

HOG_END = 1100.0


@pytest.mark.parametrize(
    ("name", "wait", "words"),
    [
        ("no GPU free", Wait(code="unschedulable", needs="8 GPUs on one host", no_free_gpus=True), "no free GPUs"),
        (
            "with an estimate",
            Wait(code="unschedulable", needs="2 hosts with 8 free GPUs", span=" under 1 leaves", start_at=0.0),
            "waiting for 2 hosts with 8 free GPUs under 1 leaves; earliest estimated start 1970-01-01 00:00",
        ),
        (
            "never",
            Wait(
                code="unresolvable",
                needs="9 GPUs on one host",
                found="needs 1 host with 9 free GPUs; 0 in the whole fabric",
            ),
            "waiting for 9 GPUs on one host; never fits the current hosts"
            " (needs 1 host with 9 free GPUs; 0 in the whole fabric)",
        ),
        ("behind", Wait(code="reservation", behind="head"), "waiting behind the reservation of head"),
        ("delaying", Wait(code="reservation", behind="head", delays=True), "would delay the reservation of head"),
        (
            "quota",
            Wait(code="over_quota", found="tenant t over its H100 quota"),
            "over quota: tenant t over its H100 quota",
        ),
    ],
)
def test_the_words_are_rendered_from_the_code(name: str, wait: Wait, words: str) -> None:
    assert wait.text() == words, name


def test_each_code_from_one_easy_cycle() -> None:
    """Two hosts: host 0 held until 1100, 6 GPUs of host 1 until 5000 (2 free). A job too big for
    the cluster, a 2-host head (reserved for 5000 on both), a long job that would take host 1's GPU
    past then, a short one that ends before (started) and one that finds no GPU the reservation leaves."""
    hog = running(job("hog", gpus=8), [(0, 8)], started=0, end=HOG_END)
    half = running(job("half", gpus=6), [(1, 6)], started=0, end=5000)
    queue = [
        job("never", gpus=24, submit=1),
        job("head", gpus=16, submit=10, p50=100),
        job("long", gpus=1, submit=20, p50=1e6, p90=1e6),
        job("short", gpus=1, submit=30, p50=10, p90=10),
        job("behind", gpus=2, submit=40, p50=10, p90=10),
    ]
    reply = run_cycle(queue, cluster(2, busy={0: 8, 1: 6}), running_jobs=[hog, half], now=100.0)
    assert [s.job_id for s in reply.starts] == ["short"]
    codes = {j: (w.code, w.behind, w.delays) for j, w in reply.waiting.items()}
    assert codes == {
        "never": ("unresolvable", None, False),
        "head": ("unschedulable", None, False),
        "long": ("reservation", "head", True),
        "behind": ("reservation", "head", False),
    }
    assert reply.waiting["head"].start_at == 5000


def test_on_a_full_cluster_the_first_waiting_job_still_gets_its_estimate() -> None:
    hog = running(job("hog", gpus=8), [(0, 8)], started=0, end=HOG_END)
    queue = [job("first", gpus=8, submit=10), job("second", gpus=8, submit=20)]
    reply = run_cycle(queue, cluster(1, busy={0: 8}), running_jobs=[hog], now=100.0)
    first, second = reply.waiting["first"], reply.waiting["second"]
    assert (first.code, first.start_at, first.no_free_gpus) == ("unschedulable", HOG_END, False)
    assert first.text().endswith(f"earliest estimated start {clock_text(HOG_END)}")
    assert (second.code, second.no_free_gpus, second.text()) == ("unschedulable", True, "no free GPUs")
