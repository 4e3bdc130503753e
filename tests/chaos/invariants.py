"""What must hold after every chaos scenario, each a named check on what the system recorded.

A check returns a `Verdict` (held or not, and what it counted) instead of asserting, so that the
report shows every invariant of a scenario even when one fails; the scenario asserts them all at
the end. The sources are independent of each other where the issue asks for it: the pool stream
(the event log every other system reads), the allocator's own ledger table in Postgres, the
scheduler's job stream, and a subscriber that listened during the faults like an outside system.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ssl
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import asyncpg
import nats
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from ibpool_proto import decode
from ibpool_proto.job import JobExited, JobFinished, JobRequeued, JobScheduled
from ibpool_proto.pool import (
    AllocationExpired,
    AllocationGranted,
    AllocationRejected,
    AllocationReleased,
    AllocationRevoked,
)
from ibpool_runtime.bus import inbox_prefix, url_user
from ibpool_runtime.streams import STREAMS, stream_for_subject

ALLOCATION_EVENTS = "ibpool.pool.allocation.>"


@dataclass(frozen=True)
class Verdict:
    name: str
    held: bool
    detail: str


@dataclass(frozen=True)
class Recorded:
    """A stream message: its stream sequence, subject, headers, the decoded event (None: not an
    event) and its body as stored."""

    seq: int
    subject: str
    headers: dict[str, str]
    event: Any
    data: bytes = b""


@dataclass(frozen=True)
class Access:
    """How a client reaches the scenario's NATS cluster: its servers (`tls://user:password@host:port`,
    all as one user) and the CA their certificates are verified against."""

    urls: tuple[str, ...]
    ca: str

    @property
    def url(self) -> str:
        """The servers as one comma-separated URL (what `Bus.connect` and the services take)."""
        return ",".join(self.urls)

    async def connect(self) -> NATS:
        """A client that reconnects through node kills, with the user's own inbox prefix."""
        return await nats.connect(
            servers=list(self.urls),
            tls=ssl.create_default_context(cafile=self.ca),
            inbox_prefix=inbox_prefix(url_user(self.url)),
            connect_timeout=3,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
        )


async def read_stream(access: Access, stream: str, attempts: int = 10) -> list[Recorded]:
    """Every message the stream holds now, in order. While a NATS node rejoins, JetStream may answer
    "temporarily unavailable" for a moment: read again, as any reader would."""
    for attempt in range(attempts):
        try:
            return await _read_stream(access, stream)
        except (nats.js.errors.ServiceUnavailableError, nats.errors.TimeoutError, nats.errors.NoRespondersError):
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(2)
    raise AssertionError("unreachable")


async def _read_stream(access: Access, stream: str) -> list[Recorded]:
    nc = await access.connect()
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        last = info.state.last_seq
        if info.state.messages == 0:
            return []
        sub = await js.pull_subscribe(
            ">", stream=stream, config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE)
        )
        out: list[Recorded] = []
        while not out or out[-1].seq < last:
            try:
                batch = await sub.fetch(500, timeout=3)
            except nats.errors.TimeoutError:
                break
            for m in batch:
                event = None
                with contextlib.suppress(Exception):  # a flooded malformed body is not an event
                    event = decode(m.data)
                out.append(Recorded(m.metadata.sequence.stream, m.subject, dict(m.headers or {}), event, m.data))
        return out
    finally:
        await nc.close()


class Subscriber:
    """An outside system's subscriber to allocation events: a durable consumer that acks each message
    and records its stream sequence, through NATS node kills and partitions (it reconnects)."""

    def __init__(self, access: Access, name: str = "chaos-observer") -> None:
        self.access = access
        self.name = name
        self.seen: list[tuple[int, str]] = []  # (stream seq, event id), redeliveries included
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.nc = await self.access.connect()
        js = self.nc.jetstream()
        config = ConsumerConfig(
            durable_name=self.name,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            filter_subject=ALLOCATION_EVENTS,
            ack_wait=5,
        )
        self.sub = await js.pull_subscribe(ALLOCATION_EVENTS, durable=self.name, stream="IBPOOL_POOL", config=config)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = await self.sub.fetch(200, timeout=1)
            except (nats.errors.TimeoutError, nats.errors.ConnectionClosedError):
                continue
            except Exception:  # a NATS node going away mid-fetch: fetch again after the reconnect
                await asyncio.sleep(0.5)
                continue
            for m in batch:
                event_id = (m.headers or {}).get("Nats-Msg-Id", "")
                self.seen.append((m.metadata.sequence.stream, event_id))
                with contextlib.suppress(Exception):  # unacked: redelivered, and counted then
                    await m.ack()

    async def drain(self, until_seq: int, timeout_s: float = 60) -> None:
        """Wait until the subscriber has seen the stream up to `until_seq`, then stop it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if max((s for s, _ in self.seen), default=0) >= until_seq:
                break
            await asyncio.sleep(0.5)
        self._stop.set()
        if self._task is not None:
            await self._task
        await self.nc.close()


# --- the checks -------------------------------------------------------------------------------------


def _replay_capacity(events: Iterable[Any], source: str) -> Verdict:
    """Replay grants and their ends in order: at no point may a GPU carry more than 1000 milli."""
    live: dict[tuple[str, str], list[tuple[tuple[str, int], int]]] = {}
    load: dict[tuple[str, int], int] = defaultdict(int)
    grants = 0
    for ev in events:
        match ev:
            case AllocationGranted():
                grants += 1
                shares = [((a.node_id, a.gpu_index), a.milli) for a in ev.assignments if a.node_id == ev.node_id]
                live[(ev.allocation_id, ev.node_id)] = shares
                for gpu, milli in shares:
                    load[gpu] += milli
                    if load[gpu] > 1000:
                        return Verdict(f"no GPU share granted twice ({source})", False,
                                       f"{gpu} at {load[gpu]} milli after {ev.allocation_id}")  # fmt: skip
            case AllocationReleased() | AllocationRevoked() | AllocationExpired():
                for gpu, milli in live.pop((ev.allocation_id, ev.node_id), []):
                    load[gpu] -= milli
    return Verdict(f"no GPU share granted twice ({source})", grants > 0, f"{grants} grants replayed")


def capacity_from_stream(pool: list[Recorded]) -> Verdict:
    return _replay_capacity((r.event for r in pool), "event log")


async def capacity_from_ledger(dsn: str) -> Verdict:
    """The allocator's own record: its ledger events table, in ledger order."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT body FROM pool_allocator.ledger_events ORDER BY version, seq")
    finally:
        await conn.close()
    events = []
    for row in rows:
        with contextlib.suppress(Exception):
            events.append(decode(row["body"].encode()))
    return _replay_capacity(events, "allocator's ledger")


def no_job_held_twice(pool: list[Recorded]) -> Verdict:
    """A job never holds two allocations at once: each grant of a job starts after its earlier ones ended.
    An allocation is live while one of its nodes holds a share: a gang that replaced a failed member
    (one node revoked, a new node granted into the same allocation) stays one live allocation."""
    live: dict[str, set[str]] = defaultdict(set)  # job -> live allocation ids
    shares: dict[str, set[str]] = defaultdict(set)  # allocation -> nodes holding a share now
    ended: set[str] = set()  # allocations whose every share ended
    for r in pool:
        match r.event:
            case AllocationGranted(job_id=job, allocation_id=alloc, node_id=node):
                others = live[job] - {alloc}
                if others:
                    return Verdict("no job held twice", False, f"{job}: {alloc} granted while {sorted(others)} live")
                if alloc not in ended:
                    live[job].add(alloc)
                    shares[alloc].add(node)
            case AllocationReleased() | AllocationRevoked() | AllocationExpired():
                alloc = r.event.allocation_id
                shares[alloc].discard(r.event.node_id)
                if not shares[alloc]:
                    live[r.event.job_id].discard(alloc)
                    ended.add(alloc)
    return Verdict("no job held twice", True, f"{len(live)} jobs")


def every_job_completed(jobs: list[str], job_events: list[Recorded]) -> Verdict:
    finished = {r.event.job_id: r.event.state for r in job_events if isinstance(r.event, JobFinished)}
    not_done = {j: finished.get(j, "not finished") for j in jobs if finished.get(j) != "completed"}
    return Verdict("every job completed, none lost", not not_done, f"{len(jobs) - len(not_done)}/{len(jobs)} completed"
                   + (f"; {dict(list(not_done.items())[:5])}" if not_done else ""))  # fmt: skip


def killed_work_regranted(killed: dict[str, dt.datetime], job_events: list[Recorded], require_requeue: bool) -> Verdict:
    """No work live on a SIGKILLed agent's node is lost: each such allocation was requeued and its job
    granted again, or (the agent came back before the failover controller judged its node failed,
    and the simulated work had gone on meanwhile) it finished where it ran. With `require_requeue`
    (the failover controller stayed up, so the node must have been failed) the work hit must have
    been requeued. `killed`: node id -> when its agent was killed. An allocation is live from its
    JobScheduled until the first of its JobExited, JobRequeued or JobFinished."""
    name = "no work on killed agents lost"
    if not killed:
        return Verdict(name, True, "no agent killed")
    scheduled: dict[str, JobScheduled] = {}
    ended: dict[str, dt.datetime] = {}
    requeued: set[str] = set()
    allocations: dict[str, set[str]] = defaultdict(set)
    for r in job_events:
        match r.event:
            case JobScheduled() as ev:
                scheduled[ev.allocation_id] = ev
                allocations[ev.job_id].add(ev.allocation_id)
            case JobExited() | JobRequeued() | JobFinished() as ev if ev.allocation_id:
                ended.setdefault(ev.allocation_id, ev.occurred_at)
                if isinstance(ev, JobRequeued):
                    requeued.add(ev.allocation_id)
    hit = {
        alloc: ev.job_id
        for alloc, ev in scheduled.items()
        for node, at in killed.items()
        if node in ev.nodes and ev.occurred_at < at and ended.get(alloc, at) >= at
    }
    completed = {r.event.allocation_id for r in job_events if isinstance(r.event, JobFinished)
                 and r.event.state == "completed"}  # fmt: skip
    regranted = [a for a, job in hit.items() if a in requeued and allocations[job] - {a}]
    survived = [a for a in hit if a not in requeued and a in completed]
    missing = [f"{hit[a]}/{a}" for a in hit if a not in regranted and a not in survived]
    held = bool(hit) and not missing and (bool(regranted) if require_requeue else True)
    detail = f"{len(hit)} allocations live on killed nodes: {len(regranted)} requeued and re-granted, "
    detail += f"{len(survived)} finished where they ran" + (f"; lost: {missing[:5]}" if missing else "")
    return Verdict(name, held, detail)


def subscriber_saw_everything(pool: list[Recorded], seen: list[tuple[int, str]]) -> Verdict:
    """The outside subscriber saw every allocation event the stream holds (no gap), and after dropping
    redeliveries (same stream sequence) no event twice."""
    expected = {r.seq for r in pool if r.subject.startswith("ibpool.pool.allocation.")}
    # The stream was read up to its last sequence then; the subscriber may have fetched events the
    # system published after that (a late release): those are not judged here.
    last = max((r.seq for r in pool), default=0)
    seen = [(s, i) for s, i in seen if s <= last]
    got = {s for s, _ in seen}
    gaps = sorted(expected - got)
    ids = [i for _, i in dict(seen).items()]
    dupes = len(ids) - len(set(ids))
    held = not gaps and dupes == 0 and got <= expected
    return Verdict("subscriber saw every allocation event", held and bool(expected),
                   f"{len(got & expected)}/{len(expected)} events, {len(seen) - len(got)} redelivered, "
                   f"{dupes} duplicate ids" + (f"; missing seqs {gaps[:5]}" if gaps else ""))  # fmt: skip


async def outbox_drained(dsn: str, timeout_s: float = 30) -> Verdict:
    """No service has an event left in its outbox (the relay publishes and deletes them)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    conn = await asyncpg.connect(dsn)
    try:
        schemas = [r["table_schema"] for r in await conn.fetch(
            "SELECT table_schema FROM information_schema.tables WHERE table_name = 'outbox'")]  # fmt: skip
        while True:
            left = {s: await conn.fetchval(f'SELECT count(*) FROM "{s}".outbox') for s in schemas}
            if not any(left.values()) or loop.time() > deadline:
                break
            await asyncio.sleep(1)
    finally:
        await conn.close()
    held = bool(schemas) and not any(left.values())
    return Verdict("no event left in an outbox", held, f"{len(schemas)} services' outboxes, {sum(left.values())} left")


def dead_letters(dlq: list[Recorded], flooded: set[str], consumed: dict[str, int]) -> Verdict:
    """Nothing dead-lettered but the flood (on `flooded` subjects); on each `consumed` subject, every
    one of its `n` flooded messages in the DLQ."""
    by_subject: dict[str, set[str]] = defaultdict(set)
    for r in dlq:
        by_subject[r.headers.get("ibpool-dlq-subject", "?")].add(r.headers.get("Nats-Msg-Id", str(r.seq)))
    stray = sorted(set(by_subject) - flooded)
    short = {s: f"{len(by_subject.get(s, ()))}/{n}" for s, n in consumed.items() if len(by_subject.get(s, ())) < n}
    held = not stray and not short
    detail = f"{len(dlq)} dead letters"
    if flooded:
        detail += f" from {len(by_subject)} of the {len(flooded)} flooded subjects"
    return Verdict("malformed events in the DLQ, nothing else", held,
                   detail + (f"; stray subjects {stray[:3]}" if stray else "")
                   + (f"; short {short}" if short else ""))  # fmt: skip


def fencing_held(pool: list[Recorded]) -> Verdict:
    """Per scheduler group, the terms of granted proposals never go down in ledger order (a stale
    leader's proposals are refused) and stale refusals are counted."""
    highest: dict[str, int] = {}
    for r in pool:
        ev = r.event
        if isinstance(ev, AllocationGranted) and ev.fencing_term is not None:
            if ev.fencing_term < highest.get(ev.scheduler_group, 0):
                return Verdict("stale leader fenced", False, f"{ev.allocation_id} granted on term {ev.fencing_term} "
                               f"after term {highest[ev.scheduler_group]}")  # fmt: skip
            highest[ev.scheduler_group] = ev.fencing_term
    stale = sum(1 for r in pool if isinstance(r.event, AllocationRejected) and r.event.reason == "stale")
    return Verdict("stale leader fenced", bool(highest), f"terms {highest}; {stale} stale proposals refused")


def degraded_not_mass_failed(health: list[Recorded]) -> Verdict:
    """A partition bigger than the failover controller's limit: ClusterDegraded (and ClusterRestored once
    it heals), never a node failed nor work requeued for it."""
    kinds = [type(r.event).__name__ for r in health if r.event is not None]
    failed = [k for k in kinds if k in ("NodeFailed", "RequeueRequested")]
    held = "ClusterDegraded" in kinds and "ClusterRestored" in kinds and not failed
    return Verdict("partition: degraded, not mass-failed", held,
                   f"{kinds.count('ClusterDegraded')} ClusterDegraded, {kinds.count('ClusterRestored')} "
                   f"ClusterRestored, {len(failed)} NodeFailed/RequeueRequested")  # fmt: skip


# --- the attacker (tests/chaos/attack.py, attacker.py) -----------------------------------------------

# What a node's failure, or its loss to the scheduler, looks like in the record.
_HARM = ("NodeFailed", "GpuFailed", "Cordoned", "DrainRequested", "RequeueRequested", "JobFlagged")


def attack_refused(report: dict[str, Any], sent: int) -> Verdict:
    """The servers let the attacker publish its crafted messages (else the rest proves nothing) and
    nothing beyond its user's permissions: each forbidden request unanswered and refused by the
    server, each snooping subscription refused with nothing received."""
    wrong = [f"{what}: {r['outcome']}, violation {r['violation']}" for what, r in report["refused"].items()
             if r["outcome"].startswith("answered") or not r["violation"]]  # fmt: skip
    wrong += [f"snooped {s}: {r['received']} received, violation {r['violation']}"
              for s, r in report["snooped"].items() if r["received"] or not r["violation"]]  # fmt: skip
    wrong += report["publish_failed"][:3]
    published = len(report["published"])
    held = not wrong and published == sent and bool(report["refused"]) and bool(report["snooped"])
    return Verdict("attacker kept to its own subjects", held,
                   f"{published}/{sent} crafted messages published, {len(report['refused'])} forbidden requests "
                   f"and {len(report['snooped'])} snoops refused" + (f"; {wrong[:3]}" if wrong else ""))  # fmt: skip


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcards: `*` one token, `>` the rest."""
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(want) == len(got)


def attack_dead_lettered(dlq: list[Recorded], report: dict[str, Any], durables: dict[str, Durable]) -> Verdict:
    """Every crafted message the attacker stored on a subject some durable consumer reads reached the
    DLQ (so a consumer read it and no handler took it), its `Nats-Expected-Stream` header
    notwithstanding. Subjects only followed (no durable) are judged by their effects alone."""

    def read(subject: str) -> bool:
        return any(
            subject_matches(f, subject) if f else stream_for_subject(subject) == d.stream
            for d in durables.values()
            for f in d.filters
        )

    stored = {p["id"] for p in report["published"] if p["stored"] and read(p["subject"])}
    unread = sum(1 for p in report["published"] if p["stored"] and not read(p["subject"]))
    dead = {r.headers.get("ibpool-dlq-header-Nats-Msg-Id", "") for r in dlq}
    reasons: dict[str, int] = defaultdict(int)
    for r in dlq:
        if r.headers.get("ibpool-dlq-header-Nats-Msg-Id", "") in stored:
            reasons[r.headers.get("ibpool-dlq-reason", "?").split(":")[0]] += 1
    missing = sorted(stored - dead)
    detail = f"{len(stored & dead)}/{len(stored)} in the DLQ (reasons {dict(reasons)}); "
    detail += f"{unread} on subjects no durable reads"
    return Verdict("attacker's messages dead-lettered", bool(stored) and not missing,
                   detail + (f"; missing {missing[:3]}" if missing else ""))  # fmt: skip


def attack_had_no_effect(records: list[Recorded], mark: str, term: int) -> Verdict:
    """No event of the system's own acted on the attack: none carries the attacker's mark (its job
    ids, allocation ids and reasons), no node or GPU was failed, cordoned or drained and no work
    requeued or revoked (the scenario has no other fault, and its agents' GPUs no random ones), no
    node was marked unusable in the ledger, and no proposal on the attacker's fencing term was
    granted."""
    harm: list[str] = []
    for r in records:
        ev = r.event
        if ev is None or ev.source == mark:
            continue
        kind = type(ev).__name__
        if mark in r.data.decode(errors="replace"):
            harm.append(f"{kind} {r.subject} carries {mark!r}")
        elif kind in _HARM or isinstance(ev, AllocationRevoked):
            harm.append(f"{kind} {r.subject} ({getattr(ev, 'reason', '')})")
        elif kind == "PoolNodeUpdated" and (ev.failed or ev.cordoned or ev.draining or ev.removed):
            harm.append(f"{kind} {ev.node_id}: failed={ev.failed} cordoned={ev.cordoned} draining={ev.draining}")
        elif isinstance(ev, AllocationGranted) and (ev.fencing_term or 0) >= term:
            harm.append(f"{ev.allocation_id} granted on term {ev.fencing_term}")
    detail = f"{len(records)} events checked" + (f"; {len(harm)} acted on it: {harm[:3]}" if harm else "")
    return Verdict("nothing the attacker sent took effect", not harm, detail)


@dataclass(frozen=True)
class Durable:
    stream: str
    filters: tuple[str, ...]  # ("",): the whole stream


async def durables(access: Access) -> dict[str, Durable]:
    """Every durable consumer on the ibpool streams, with its stream and filter subjects."""
    nc = await access.connect()
    found: dict[str, Durable] = {}
    try:
        js = nc.jetstream()
        for stream in (s.name for s in STREAMS if s.name != "IBPOOL_DLQ"):
            for c in await js.consumers_info(stream):
                if c.config.durable_name:
                    filters = tuple(c.config.filter_subjects or [c.config.filter_subject or ""])
                    found[c.name] = Durable(stream, filters)
    finally:
        await nc.close()
    return found


def durables_kept(before: dict[str, Durable], after: dict[str, Durable]) -> Verdict:
    """Every durable there before the attack is still there, with the same filter."""
    missing = sorted(set(before) - set(after))
    changed = sorted(d for d in set(before) & set(after) if before[d] != after[d])
    detail = f"{len(before) - len(missing)}/{len(before)} durables kept" + (f"; missing {missing}" if missing else "")
    detail += f"; re-filtered {changed}" if changed else ""
    return Verdict("every durable kept as its service made it", bool(before) and not missing and not changed, detail)
