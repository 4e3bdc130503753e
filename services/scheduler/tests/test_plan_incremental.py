"""The cycle's incremental paths give what the straightforward ones give: the host view redone only
where nodes or GPUs in flight changed (`host_view_cached`), the placement view keyed on the same host
lists, telemetry refreshed for the named hosts only, and proposed jobs' running pictures reused:
cycle after cycle on one ledger, a cycle with the cache equals the cycle without it."""

from __future__ import annotations

import datetime as dt
import random

import msgspec
import pytest

from ibpool_core.pool import allocate as al
from ibpool_core.pool.ledger import Ledger
from ibpool_core.sched import records as jobs
from ibpool_core.sched.book import ChangedMap, LiveBook
from ibpool_core.sched.cycle import CycleConfig
from ibpool_core.sched.framework import Framework, Telemetry, build_profile
from ibpool_core.sched.pool_cycle import (
    InFlight,
    LeafSource,
    PlacementInputs,
    PlanCache,
    host_view,
    host_view_cached,
    plan_cycle,
    taken_in_flight,
)
from ibpool_core.sched.queueing import make_policy
from ibpool_core.sched.records import JobRecord
from ibpool_proto.health import Cordoned, NodeFailed, Uncordoned
from ibpool_proto.pool import GpuAssignment, ProposePlacement, ReleaseAllocation
from ibpool_scheduler.service import DEFAULT_PROFILE

from .test_glue import T0, job, ledger_of, node

LEAF = "ibpool.io/leaf"


def grant(ledger: Ledger, j: JobRecord, assignments: list, at: dt.datetime) -> JobRecord:  # type: ignore[type-arg]
    cmd = ProposePlacement(
        source="t",
        key=j.job_id,
        job_id=j.job_id,
        tenant=j.tenant,
        queue=j.queue,
        ledger_version=ledger.version,
        assignments=assignments,
    )
    al.handle(ledger, cmd, at)
    return jobs.granted(
        jobs.proposed(j, cmd.id, assignments, None), cmd.id, sorted({a.node_id for a in assignments}), at
    )


def test_the_cached_host_view_is_the_host_view_through_every_kind_of_change() -> None:
    ledger = ledger_of(*(node(f"n{i}", 4, leaf="a" if i < 3 else "b") for i in range(6)))
    cache = PlanCache()
    steps: list[tuple[object, dict[str, set[int]]]] = [
        (None, {}),
        (None, {"n1": {0, 1}}),  # GPUs in flight
        (None, {}),  # ... and granted or gone
        (Cordoned(source="f", key="n2", node_id="n2", scope="gpu", gpu_index=3, reason="hot"), {"n4": {2}}),
        (Cordoned(source="f", key="n5", node_id="n5", scope="node", reason="hot"), {}),  # leaves the view
        (Uncordoned(source="f", key="n5", node_id="n5", scope="node", reason="ok"), {"n5": {0}}),
        (node("n9", 4, leaf="c"), {}),  # a new node
        (node("n0", 4, leaf="c"), {}),  # re-registered under another leaf
        (NodeFailed(source="f", key="n3", node_id="n3", reason="silent"), {"n1": {3}}),
    ]
    kept_lists = 0
    previous = None
    for change, taken in steps:
        if change is not None:
            al.handle(ledger, change, T0)  # type: ignore[arg-type]
        fast = host_view_cached(ledger, taken, LeafSource(LEAF), cache)
        assert fast == host_view(ledger, taken, LeafSource(LEAF))
        if previous is not None and fast.node_ids is previous.node_ids:
            kept_lists += 1
        previous = fast
    assert kept_lists >= 3  # unchanged layouts kept the host lists (what the placement view keys on)


def test_a_cycle_with_every_cache_is_the_cycle_without_any() -> None:
    rng = random.Random(7)
    names = [f"n{i:02d}" for i in range(24)]
    ledger = ledger_of(*(node(n, 8, leaf=f"l{i // 6}") for i, n in enumerate(names)))
    framework = Framework(build_profile(DEFAULT_PROFILE))
    cache = PlanCache()
    live: dict[str, JobRecord] = {}
    in_flight: list[tuple[int, str]] = []
    telemetry: dict[str, Telemetry] = {}
    started = 0
    views: list[object] = []
    for cycle in range(12):
        at = T0 + dt.timedelta(seconds=10 * cycle)
        for k in range(rng.randint(2, 9)):
            jid = f"c{cycle:02d}-{k}"
            if rng.random() < 0.15:
                live[jid] = job(jid, 8, hosts=2, at=10 * cycle)
            else:
                live[jid] = job(jid, rng.choice((1, 1, 2, 4)), at=10 * cycle, time_limit_s=rng.choice((None, 600.0)))
        if cycle % 3 == 1:  # telemetry comes, changes and goes
            telemetry = {n: Telemetry(gpu_util=rng.random(), temperature_c=80.0) for n in rng.sample(names, 6)}
        if cycle == 9:
            al.handle(ledger, Cordoned(source="f", key="n05", node_id="n05", scope="node", reason="hot"), at)
        inputs = PlacementInputs(framework, telemetry=telemetry, sample=rng.choice((0, 4)))
        args = (ledger, list(live.values()), at, make_policy("fifo"), CycleConfig(), LEAF)
        index = InFlight()
        for j in live.values():
            index.add(j)
        assert index.taken(ledger) == taken_in_flight(ledger, live.values())
        plan = plan_cycle(*args, cache, placement=inputs, in_flight=index.taken(ledger))
        assert plan == plan_cycle(
            *args, placement=PlacementInputs(framework, telemetry=telemetry, sample=inputs.sample)
        )
        views.append(cache.view)
        for p in plan.proposals:  # proposed now, granted two cycles later
            live[p.job_id] = jobs.proposed(live[p.job_id], f"p-{p.job_id}", p.assignments, None)
            in_flight.append((cycle + 2, p.job_id))
            started += 1
        for due, jid in [x for x in in_flight if x[0] <= cycle]:
            in_flight.remove((due, jid))
            j = live[jid]
            live[jid] = grant(ledger, j, j.proposal, at)
    assert started > 20
    assert len({id(v) for v in views}) < len(views) / 2  # the placement view was kept across cycles
    assert cache.promised or cache.running  # the running pictures were kept for the next cycle


def test_the_kept_gpus_in_flight_are_those_a_walk_over_the_jobs_finds() -> None:
    """`InFlight` against `taken_in_flight` through proposals, grants the replica shows or not yet,
    replacements, a requeue and ends, its records added and removed as `LiveJobs` does."""
    rng = random.Random(3)
    ledger = ledger_of(*(node(f"n{i}", 8, leaf="a") for i in range(6)))
    index = InFlight()
    live: dict[str, JobRecord] = {}

    def put(j: JobRecord | None, job_id: str) -> None:
        if (old := live.pop(job_id, None)) is not None:
            index.remove(old)
        if j is not None:
            live[job_id] = j
            index.add(j)

    free = [GpuAssignment(node_id=f"n{i}", gpu_index=g) for i in range(6) for g in range(8)]
    rng.shuffle(free)
    checked = 0
    for step in range(60):
        jid = f"j{step:02d}"
        put(job(jid, 1, at=step), jid)
        for held_id in rng.sample(sorted(live), k=min(3, len(live))):
            j = live[held_id]
            if j.state == "queued" and free:
                put(jobs.proposed(j, f"p-{held_id}-{step}", [free.pop()], None), held_id)
            elif j.state == "proposed" and rng.random() < 0.5:
                if rng.random() < 0.5:  # the replica shows the grant
                    put(grant(ledger, j, j.proposal, T0), held_id)
                else:  # the scheduler recorded the grant before the replica showed it
                    put(jobs.granted(j, j.proposal_id or "", sorted({a.node_id for a in j.proposal}), T0), held_id)
            elif j.holding and rng.random() < 0.3 and free:
                replace = [free.pop()]
                put(
                    msgspec.structs.replace(
                        j, replacing=j.proposal[0].node_id, replace_id=f"r-{held_id}", replace_proposal=replace
                    ),
                    held_id,
                )
            elif j.holding and j.allocation_id in ledger.allocations and rng.random() < 0.2:
                # released on the ledger before the scheduler hears of it: its GPUs count as in flight
                al.handle(ledger, ReleaseAllocation(source="t", key=held_id, allocation_id=j.allocation_id), T0)
            elif j.live and rng.random() < 0.2:
                put(None, held_id)  # ended: no longer live
        assert index.taken(ledger) == taken_in_flight(ledger, live.values())
        checked += bool(index.taken(ledger))
    assert checked > 20
    states = {j.state for j in live.values()}
    assert {"queued", "proposed", "scheduled"} <= states


@pytest.mark.parametrize(("policy", "framework_on"), [("fifo", True), ("priority", True), ("fifo", False)])
def test_a_cycle_on_a_live_book_is_the_cycle_on_its_list(policy: str, framework_on: bool) -> None:
    """The running jobs kept by the book's changes (`HeldRuns`), the jobs past their limit found by
    deadline, the cycle's free view lent and given back and the telemetry read by its changes give
    the plan a walk over `list(book)` gives, byte for byte, through submissions in two queues,
    proposals, grants, starts, kills at the time limit, preemptions, finishes, a cordon and its end, and cycles
    whose plan is not carried out; and a cycle computes the running picture of the jobs that
    changed only."""
    rng = random.Random(11)
    names = [f"n{i:02d}" for i in range(24)]
    ledger = ledger_of(*(node(n, 8, leaf=f"l{i // 6}") for i, n in enumerate(names)))
    framework = Framework(build_profile(DEFAULT_PROFILE)) if framework_on else None
    cache, book = PlanCache(), LiveBook()
    telemetry: ChangedMap[Telemetry] = ChangedMap()
    seq = 0
    in_flight: list[tuple[int, str]] = []
    kinds: dict[str, int] = {"kills": 0, "preemptions": 0, "starts": 0, "kept": 0, "absent": 0}

    def put(j: JobRecord) -> None:
        nonlocal seq
        if j.job_id in book.records:
            book.put(book.seq_of(j.job_id), j)
        else:
            seq += 1
            book.put(seq, j)

    def end(job_id: str, at: dt.datetime) -> None:
        j = book.drop(job_id)
        assert j is not None
        if j.allocation_id is not None and j.allocation_id in ledger.allocations:
            al.handle(ledger, ReleaseAllocation(source="t", key=j.allocation_id, allocation_id=j.allocation_id), at)

    for cycle in range(40):
        at = T0 + dt.timedelta(seconds=10 * cycle)
        for k in range(rng.randint(0, 6)):
            jid = f"c{cycle:02d}-{k}"
            queue = rng.choice(("q", "q", "r"))
            limit = rng.choice((None, 25.0, 600.0))
            if rng.random() < 0.15:
                j = job(jid, 8, hosts=2, at=10 * cycle, time_limit_s=limit)
            else:
                gpus = rng.choice((1, 1, 2, 4))
                j = job(jid, gpus, at=10 * cycle, time_limit_s=limit, priority=rng.randint(0, 3))
            put(msgspec.structs.replace(j, queue=queue))
        held = [j for j in book if j.holding]
        for j in rng.sample(held, min(len(held), rng.randint(0, 2))):  # some finish
            end(j.job_id, at)
        for j in [j for j in book if j.state == "scheduled" and rng.random() < 0.5]:  # some start
            put(msgspec.structs.replace(j, state="running", started_at=at))
        if cycle in (20, 27):  # a node leaves the cycle's hosts with its jobs, and comes back
            kind = Cordoned if cycle == 20 else Uncordoned
            al.handle(ledger, kind(source="f", key="n05", node_id="n05", scope="node", reason="hot"), at)
        seen = cache.held.version if cache.held is not None else 0  # the book's version at the last cycle
        changed = len(set(book.changes_since(book.token, seen) or book.records))
        for n in rng.sample(names, 3):  # telemetry comes, changes and ages out
            if rng.random() < 0.3:
                telemetry.drop(n)
            else:
                telemetry.put(n, Telemetry(gpu_util=rng.random(), temperature_c=rng.choice((40.0, 85.0))))
        inputs = PlacementInputs(framework, telemetry=telemetry, sample=4) if framework else PlacementInputs()
        config = CycleConfig(min_runtime_s=15.0)
        args = (at, make_policy(policy, **({"preempt_classes": True} if policy == "priority" else {})), config, LEAF)
        fast = plan_cycle(ledger, book, *args, cache, placement=inputs, in_flight=taken_in_flight(ledger, book))
        slow = plan_cycle(
            ledger,
            list(book),
            *args,
            placement=PlacementInputs(framework, telemetry=dict(telemetry), sample=4)
            if framework
            else PlacementInputs(),
        )
        assert msgspec.json.encode(fast) == msgspec.json.encode(slow), f"cycle {cycle}"
        assert cache.held is not None and cache.held.built <= changed, (cycle, cache.held.built, changed)
        kinds["kept"] += len(cache.held.runs) - cache.held.built
        kinds["absent"] += len(cache.held.absent)  # jobs on the cordoned node, out of the picture
        if cycle == 27:
            assert not cache.held.absent  # back with their node
        kinds["kills"] += len(fast.killed)
        kinds["preemptions"] += len(fast.preempted)
        kinds["starts"] += len(fast.proposals)
        if cycle % 5 == 3:
            continue  # this cycle's writes lost (another leader wrote first): nothing of it is carried out
        for job_id in [*fast.killed, *fast.preempted_ids()]:
            end(job_id, at)
        for p in fast.proposals:  # proposed now, granted two cycles later
            put(jobs.proposed(book.records[p.job_id], f"p-{p.job_id}", p.assignments, None))
            in_flight.append((cycle + 2, p.job_id))
        for due, jid in [x for x in in_flight if x[0] <= cycle]:
            in_flight.remove((due, jid))
            j = book.records.get(jid)
            if j is not None and j.state == "proposed":
                put(grant(ledger, j, j.proposal, at))
    assert kinds["starts"] > 40 and kinds["kills"] > 3 and kinds["kept"] > 100 and kinds["absent"] > 0, kinds
    if policy == "priority":
        assert kinds["preemptions"] > 0, kinds
