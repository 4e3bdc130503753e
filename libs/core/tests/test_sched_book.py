"""`LiveBook`: the live jobs in submission order, with the queued ones, the ones holding or promised
GPUs, the SHARP trees held and the changes since a reader looked, kept as jobs come, change and go."""

from __future__ import annotations

import datetime as dt
import random

import msgspec
import pytest

from ibpool_core.sched.book import ChangeLog, LiveBook
from ibpool_core.sched.records import JobPlacement, JobRecord
from ibpool_core.sched.sharp import SharpTree

T0 = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)
STATES = ("queued", "proposed", "scheduled", "running")


def job(job_id: str, state: str = "queued", tree: bool = False) -> JobRecord:
    placement = JobPlacement(ranks=["a"], sharp_tree=SharpTree(trees=1, switches=("s",), cables=())) if tree else None
    return JobRecord(
        job_id=job_id, tenant="t", queue="q", gpus_per_host=1, hosts=1, submitted_at=T0, queued_at=T0, state=state,  # type: ignore[arg-type]
        placement=placement,
    )  # fmt: skip


def test_the_book_is_its_jobs_in_seq_order_whatever_order_they_came_in() -> None:
    book = LiveBook()
    book.put(30, job("c"))
    book.put(10, job("a", "running"))
    book.put(20, job("b", "proposed", tree=True))
    assert [j.job_id for j in book] == ["a", "b", "c"] == [j.job_id for j in book[:]]
    assert book[1].job_id == "b" and len(book) == 3
    assert [j.job_id for j in book.queued()] == ["c"]
    assert book.held.ids == ["a", "b"]
    assert list(book.sharp_held()) == ["b"]
    book.put(30, job("c", "scheduled"))  # queued -> held
    book.put(20, job("b", "running"))  # its tree gone
    assert book.queued() == [] and book.held.ids == ["a", "b", "c"] and book.sharp_held() == {}
    assert book.drop("a") is not None and book.drop("a") is None
    assert [j.job_id for j in book] == ["b", "c"] and book.held.ids == ["b", "c"]


def test_a_seq_belongs_to_one_job() -> None:
    book = LiveBook()
    book.put(1, job("a"))
    with pytest.raises(ValueError, match="seq 1 is job a's, not b's"):
        book.put(1, job("b"))
    book.put(2, job("a"))  # a job may move to another seq: its old one is free again
    book.put(1, job("b"))
    assert [j.job_id for j in book] == ["b", "a"]


def test_a_reader_gets_the_changes_since_it_looked_or_is_told_to_read_it_whole() -> None:
    book = LiveBook()
    book.put(1, job("a"))
    token, seen = book.token, book.version
    assert book.changes_since(token, seen) == []
    book.put(2, job("b"))
    book.put(1, job("a", "proposed"))
    book.drop("b")
    assert book.changes_since(token, seen) == ["b", "a", "b"]
    assert book.changes_since(object(), seen) is None  # another book's reader
    assert book.changes_since(token, book.version + 1) is None  # a version this book never had
    book.clear()
    assert book.changes_since(token, seen) is None and len(book) == 0
    # The log keeps its newer half: a reader from before that reads the book whole.
    token, seen = book.token, book.version
    for i in range(ChangeLog.KEEP + 1):
        book.put(1, job("a", STATES[i % 4]))
    assert book.changes_since(token, seen) is None
    assert book.changes_since(token, book.version - 10) == ["a"] * 10


def test_the_kept_indexes_are_what_a_walk_over_the_jobs_finds() -> None:
    rng = random.Random(5)
    book = LiveBook()
    seqs: dict[str, int] = {}
    for step in range(3000):
        job_id = f"j{rng.randrange(200)}"
        if rng.random() < 0.2:
            book.drop(job_id)
            continue
        seq = seqs.setdefault(job_id, step)
        book.put(seq, job(job_id, rng.choice(STATES), tree=rng.random() < 0.1))
        if step % 97 == 0:
            walk = sorted(book.records.values(), key=lambda j: book.seq_of(j.job_id))
            assert list(book) == walk
            assert book.queued() == [j for j in walk if j.state == "queued"]
            assert book.held.ids == [j.job_id for j in walk if j.state != "queued"]
            assert book.sharp_held() == {
                j.job_id: j.placement.sharp_tree
                for j in walk
                if j.state != "queued" and j.placement is not None and j.placement.sharp_tree is not None
            }
            assert msgspec.json.encode(list(book)) == msgspec.json.encode(walk)
