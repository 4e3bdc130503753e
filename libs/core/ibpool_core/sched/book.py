"""The live jobs a scheduling cycle decides on, kept by their changes: `LiveBook`.

A scheduler holds thousands of jobs on a large cluster and runs a cycle many times a second; what a
cycle reads of them (the queued ones, the ones holding or promised GPUs, the SHARP trees held, what
changed since the last cycle) is kept here as jobs come, change and go, so that finding it costs
the changes and the queue, not a walk over every held job. The book is a `Sequence[JobRecord]` in
the caller's submission order: a decision made on it is the decision made on `list(book)`
(`pool_cycle.plan_cycle` takes either; `libs/core/tests/test_sched_book.py` checks the same bytes).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from typing import Generic, TypeVar, overload

from ibpool_core.changes import ChangeLog
from ibpool_core.sched.records import HOLDING, JobRecord
from ibpool_core.sched.sharp import SharpTree

# The states whose jobs hold GPUs or have them promised (proposed): such a job holds its SHARP trees
# from its proposal until it ends or goes back to the queue.
HOLDING_OR_PROPOSED = frozenset(("proposed", *HOLDING))


class Ordered:
    """Job ids in increasing order of their seq: added and removed by bisection (a move in C, no
    walk in Python)."""

    __slots__ = ("ids", "seqs")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.ids: list[str] = []

    def __len__(self) -> int:
        return len(self.seqs)

    def add(self, seq: int, job_id: str) -> int:
        """Add `job_id` at `seq`; its position."""
        i = bisect_left(self.seqs, seq)
        self.seqs.insert(i, seq)
        self.ids.insert(i, job_id)
        return i

    def position(self, seq: int) -> int | None:
        i = bisect_left(self.seqs, seq)
        return i if i < len(self.seqs) and self.seqs[i] == seq else None

    def remove(self, seq: int) -> int | None:
        """Remove what is at `seq`; its position (None if nothing was)."""
        i = self.position(seq)
        if i is not None:
            del self.seqs[i]
            del self.ids[i]
        return i


V = TypeVar("V")


class ChangedMap(Mapping[str, V], Generic[V]):
    """A mapping kept by `put` and `drop`, with the keys changed since a reader looked (`log`):
    what a cycle reads of, say, every node's telemetry, in the work of what changed."""

    def __init__(self) -> None:
        self._items: dict[str, V] = {}
        self.log = ChangeLog()

    def __getitem__(self, key: str) -> V:
        return self._items[key]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: str, default: V | None = None) -> V | None:  # type: ignore[override]
        return self._items.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def put(self, key: str, value: V) -> None:
        """Set `key` (a change only if the value differs)."""
        items = self._items
        old = items.get(key)
        if old is not None and (old is value or old == value):
            return
        items[key] = value
        self.log.note(key, len(items))

    def drop(self, key: str) -> None:
        if self._items.pop(key, None) is not None:
            self.log.note(key, len(self._items))


class LiveBook(Sequence[JobRecord]):
    """The live jobs in submission order, each under the caller's order key `seq` (unique per job:
    the scheduler's row seq), kept by `put` and `drop`.

    What a cycle reads without a walk over every job: `queued()` (in order), `held` (the ids of the
    jobs holding or promised GPUs, in order), `sharp_held()`, `records` (by id) and
    `changes_since(token, version)`: the ids put or dropped since a reader's `(token, version)`,
    None when it must read the book whole (another book, a `clear`, or a past the log no longer
    holds). `token` changes with `clear`; `version` counts the changes.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.log = ChangeLog()
        self._records: dict[str, JobRecord] = {}
        self._seq: dict[str, int] = {}
        self._owner: dict[int, str] = {}  # seq -> job id
        self._all = Ordered()
        self._queued = Ordered()
        self._held = Ordered()
        self._sharp = Ordered()  # held or promised jobs with a SHARP tree (few: the fabric's trees)
        self._list: list[JobRecord] | None = None

    # Sequence, in submission order.
    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[JobRecord]:
        records = self._records
        return (records[job_id] for job_id in self._all.ids)

    @overload
    def __getitem__(self, index: int) -> JobRecord: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[JobRecord]: ...
    def __getitem__(self, index: int | slice) -> JobRecord | Sequence[JobRecord]:
        if self._list is None:
            self._list = list(self)
        return self._list[index]

    @property
    def records(self) -> Mapping[str, JobRecord]:
        """Job id -> record. Not to be changed."""
        return self._records

    @property
    def token(self) -> object:
        return self.log.token

    @property
    def version(self) -> int:
        return self.log.version

    @property
    def held(self) -> Ordered:
        """The jobs holding or promised GPUs, by seq. Not to be changed."""
        return self._held

    def seq_of(self, job_id: str) -> int:
        return self._seq[job_id]

    def queued(self) -> list[JobRecord]:
        """The queued jobs in submission order."""
        records = self._records
        return [records[job_id] for job_id in self._queued.ids]

    def sharp_held(self) -> dict[str, SharpTree]:
        """Job id -> the SHARP tree it holds, of the jobs holding or promised GPUs, in submission order."""
        out: dict[str, SharpTree] = {}
        for job_id in self._sharp.ids:
            placement = self._records[job_id].placement
            if placement is not None and placement.sharp_tree is not None:
                out[job_id] = placement.sharp_tree
        return out

    def changes_since(self, token: object, version: int) -> list[str] | None:
        """The ids put or dropped since `version` of this book (`token`): see `ChangeLog`."""
        return self.log.changes_since(token, version)

    def put(self, seq: int, job: JobRecord) -> None:
        """Add `job` at `seq`, or replace the record of a job already here (at its new `seq`).
        ValueError when `seq` is another job's."""
        job_id = job.job_id
        owner = self._owner.get(seq)
        if owner is not None and owner != job_id:
            raise ValueError(f"seq {seq} is job {owner}'s, not {job_id}'s")
        self._unindex(job_id)
        self._records[job_id] = job
        self._seq[job_id] = seq
        self._owner[seq] = job_id
        self._all.add(seq, job_id)
        if job.state == "queued":
            self._queued.add(seq, job_id)
        elif job.state in HOLDING_OR_PROPOSED:
            self._held.add(seq, job_id)
            if job.placement is not None and job.placement.sharp_tree is not None:
                self._sharp.add(seq, job_id)
        self._changed(job_id)

    def drop(self, job_id: str) -> JobRecord | None:
        """Remove the job; its record (None if it was not here)."""
        job = self._records.get(job_id)
        if job is None:
            return None
        self._unindex(job_id)
        del self._records[job_id]
        self._changed(job_id)
        return job

    def clear(self) -> None:
        """Empty the book; readers read it whole next time."""
        self._reset()

    def _unindex(self, job_id: str) -> None:
        seq = self._seq.pop(job_id, None)
        if seq is None:
            return
        del self._owner[seq]
        for index in (self._all, self._queued, self._held, self._sharp):
            index.remove(seq)

    def _changed(self, job_id: str) -> None:
        self._list = None
        self.log.note(job_id, len(self._records))
