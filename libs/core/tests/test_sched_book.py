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


def test_the_leases_watched_by_changes_are_those_a_walk_finds_due() -> None:
    """`LeaseWatch.due` against `leases_due` through grants, renewals (some landing late), leases
    left to run out, allocations not in the ledger yet, finishes and requeues."""
    from ibpool_core.pool.ledger import Allocation
    from ibpool_core.sched.pool_cycle import LeaseWatch, leases_due

    rng = random.Random(9)
    lease_s = 60.0
    book, watch = LiveBook(), LeaseWatch()
    allocations: dict[str, Allocation] = {}
    seqs: dict[str, int] = {}
    now = T0
    found = 0
    for step in range(400):
        now += dt.timedelta(seconds=rng.choice((1.0, 2.0, 7.0)))
        job_id = f"j{rng.randrange(60)}"
        seq = seqs.setdefault(job_id, step)
        roll = rng.random()
        if roll < 0.25:  # granted a new allocation (the ledger may not show it yet)
            allocation_id = f"a{step}"
            book.put(seq, msgspec.structs.replace(job(job_id, "scheduled"), allocation_id=allocation_id))
            if rng.random() < 0.8:
                allocations[allocation_id] = Allocation(
                    allocation_id=allocation_id, command_id=allocation_id, job_id=job_id, tenant="t", queue="q",
                    kind="whole", nodes=("n",), grants=(), lease_expires_at=now + dt.timedelta(seconds=lease_s),
                )  # fmt: skip
        elif roll < 0.35:
            book.drop(job_id)
        elif roll < 0.45:
            book.put(seq, job(job_id, "queued"))
        elif roll < 0.55 and book.records.get(job_id) is not None:  # a record change, same allocation
            book.put(seq, msgspec.structs.replace(book.records[job_id], state="running"))
        for _, allocation_id in leases_due(book, allocations, now, lease_s):
            if rng.random() < 0.6:  # renewed (the others wait, or their renewal lands later)
                old = allocations[allocation_id]
                allocations[allocation_id] = msgspec.structs.replace(
                    old, lease_expires_at=now + dt.timedelta(seconds=lease_s)
                )
        if step % 23 == 0:  # an allocation the walk never saw grant lands late
            for j in book:
                if j.allocation_id is not None and j.allocation_id not in allocations:
                    allocations[j.allocation_id] = Allocation(
                        allocation_id=j.allocation_id, command_id="c", job_id=j.job_id, tenant="t", queue="q",
                        kind="whole", nodes=("n",), grants=(), lease_expires_at=now,
                    )  # fmt: skip
                    break
        expected = leases_due(book, allocations, now, lease_s)
        assert watch.due(book, allocations, now, lease_s) == expected, step
        found += len(expected)
    assert found > 50
