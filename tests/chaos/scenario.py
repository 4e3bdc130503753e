"""One chaos scenario: a steady load of jobs, faults on their own timeline, then every invariant.

The load submits JOBS jobs at RATE_PER_S to the scheduler replicas' HTTP APIs (whichever answers:
a client retries the other replica while one is down; the job id makes a repeat harmless): whole
GPUs, two-node gangs and half GPUs mixed. While it runs, an outside subscriber records every
allocation event. The faults fire at their offsets from the start of the load. Afterwards the
scenario waits until every job has finished, then checks the invariants of `invariants.py` and
returns a report row; the test asserts that every invariant held.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from dataclasses import dataclass, field

import aiohttp

from ibpool_proto.codec import ALL_MESSAGES
from ibpool_proto.job import JobFinished
from ibpool_proto.pool import AllocationExpired, AllocationGranted, AllocationReleased, AllocationRevoked
from ibpool_runtime.bus import Bus
from ibpool_runtime.streams import STREAMS

from . import attack
from . import invariants as inv
from .system import ATTACKER_HOLDS, System

JOBS = 30
RATE_PER_S = 2.0
FINISH_TIMEOUT_S = 240.0

# Malformed bodies (broken JSON, wrong types, unknown tags) on the subject of every message of the
# contract. Each of these six is read by a durable consumer of a service, so all of its flood must
# reach the dead-letter stream; on the others the check is that nothing but the flood does.
CONSUMED = (
    "ibpool.pool.placement.propose.x",
    "ibpool.pool.allocation.request.x",
    "ibpool.job.job.submit.x",
    "ibpool.node.node.registered.x",
    "ibpool.health.node.failed.x",
    "ibpool.fabric.topology.published.x",
)
FLOODED = tuple(sorted({f"{m.subject_root()}.x" for m in ALL_MESSAGES} | set(CONSUMED)))
FLOOD_PER_SUBJECT = 20


@dataclass(frozen=True)
class Fault:
    at_s: float
    action: str  # kill, start, restart, pause, unpause, disconnect, connect, flood, attack
    role: str = ""  # a role of the system, or a symbolic one (System.resolve)

    def __str__(self) -> str:
        return f"{self.action} {self.role}".strip() + f" @{self.at_s:g}s"


@dataclass
class Outcome:
    """A report row: what was done to the system and what held afterwards."""

    scenario: str
    faults: list[str] = field(default_factory=list)
    submitted: int = 0
    finished: int = 0
    events_checked: int = 0
    recover_s: float | None = None
    verdicts: list[inv.Verdict] = field(default_factory=list)

    @property
    def held(self) -> bool:
        return bool(self.verdicts) and all(v.held for v in self.verdicts)

    def failures(self) -> str:
        return "\n".join(f"{v.name}: {v.detail}" for v in self.verdicts if not v.held)


def job_body(i: int) -> dict[str, object]:
    body: dict[str, object] = {
        "id": f"chaos-{i:03d}",
        "tenant": "chaos",
        "workload": {"simulated_runtime_s": 2 + i % 3},
    }
    if i % 5 == 4:
        body.update(hosts=2, gpus_per_host=2)  # a gang: both or neither
    elif i % 7 == 3:
        body.update(fraction=0.5)
    else:
        body.update(gpus=1 + i % 4)
    return body


async def ensure_streams(system: System, timeout_s: float = 90) -> None:
    """The admin's step: the R3 streams, once the cluster has elected a JetStream meta leader."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin = system.access()
            bus = await Bus.connect(admin.url, name="chaos-admin", tls_ca=admin.ca)
            try:
                await bus.ensure_streams(replicas=3, specs=STREAMS)
                return
            finally:
                await bus.close()
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(2)


async def wait_ready(system: System, timeout_s: float = 180) -> None:
    """Every scheduler replica sees every node, and one of them leads."""
    deadline = time.monotonic() + timeout_s
    state: dict[str, object] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
        while time.monotonic() < deadline:
            try:
                for url in system.scheduler_urls:
                    async with http.get(f"{url}/v1/scheduler") as r:
                        state[url] = await r.json() if r.status == 200 else r.status
                views = [v for v in state.values() if isinstance(v, dict)]
                if len(views) == len(system.scheduler_urls) and all(v["nodes"] >= system.layout.nodes for v in views) \
                        and any(v["leader"] for v in views):  # fmt: skip
                    return
            except (aiohttp.ClientError, TimeoutError, KeyError):
                pass
            await asyncio.sleep(1)
    raise AssertionError(f"the system was not ready within {timeout_s} s: {state}")


async def _submit(http: aiohttp.ClientSession, urls: list[str], body: dict[str, object]) -> None:
    deadline = time.monotonic() + 90
    attempt = 0
    while True:
        url = urls[attempt % len(urls)]
        attempt += 1
        try:
            async with http.post(f"{url}/v1/jobs", json=body) as r:
                if r.status in (200, 201):
                    return
                detail = await r.text()
                if r.status < 500:
                    raise AssertionError(f"job {body['id']} refused: {r.status} {detail}")
        except (aiohttp.ClientError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"no scheduler replica took job {body['id']} within 90 s")
        await asyncio.sleep(0.5)


async def flood(access: inv.Access) -> None:
    nc = await access.connect()
    try:
        js = nc.jetstream()
        bodies = [b"{not json", b'{"type": "io.ibpool.pool.placement.propose.v1", "job_id": 7}', b'{"type": "nope.v9"}']
        for subject in FLOODED:
            for i in range(FLOOD_PER_SUBJECT):
                await js.publish(subject, bodies[i % len(bodies)], headers={"Nats-Msg-Id": f"flood-{subject}-{i}"})
    finally:
        await nc.close()


async def run(name: str, system: System, faults: list[Fault], *, extra: tuple[str, ...] = ()) -> Outcome:
    """Load + faults, then the invariants. `extra`: further checks by name ("fencing")."""
    out = Outcome(scenario=name)
    await wait_ready(system)
    observer = inv.Subscriber(system.access("subscriber"))
    await observer.start()
    killed_nodes: dict[str, dt.datetime] = {}
    last_fault_at: dt.datetime | None = None
    flooded = False
    plan: attack.Plan | None = None
    durables_before: dict[str, inv.Durable] = {}
    started = time.monotonic()

    async def inject() -> None:
        nonlocal last_fault_at, flooded, plan, durables_before
        for fault in sorted(faults, key=lambda f: f.at_s):
            await asyncio.sleep(max(0.0, fault.at_s - (time.monotonic() - started)))
            at = dt.datetime.now(dt.UTC)
            if fault.action == "flood":
                await flood(system.access())
                flooded = True
                role = "bus"
            elif fault.action == "attack":
                plan = await aim(system)
                durables_before = await inv.durables(system.access())
                await asyncio.to_thread(system.start_attacker, plan.to_json())
                role = "bus (an agent's credentials)"
            else:
                role = await asyncio.to_thread(system.act, fault.action, fault.role)
            if fault.action == "kill" and role.startswith("agent-"):
                for node in system.layout.agent_nodes(int(role.split("-")[1])):
                    killed_nodes.setdefault(node, at)
            out.faults.append(f"{fault.action} {role} @{fault.at_s:g}s")
            last_fault_at = at

    async def load() -> list[str]:
        jobs = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            for i in range(JOBS):
                body = job_body(i)
                await _submit(http, system.scheduler_urls, body)
                jobs.append(str(body["id"]))
                await asyncio.sleep(1 / RATE_PER_S)
        return jobs

    _, jobs = await asyncio.gather(inject(), load())
    out.submitted = len(jobs)

    deadline = time.monotonic() + FINISH_TIMEOUT_S
    while True:
        job_events = await inv.read_stream(system.access(), "IBPOOL_JOB")
        done = {r.event.job_id for r in job_events if isinstance(r.event, JobFinished)} & set(jobs)
        if done == set(jobs) or time.monotonic() > deadline:
            break
        await asyncio.sleep(3)
    out.finished = len(done)
    report = await asyncio.to_thread(system.attacker_report) if plan is not None else None
    # With the failover controller down too, a killed agent may be back before its node is judged failed.
    failover_killed = any(f.startswith("kill failover") for f in out.faults)
    pool = await inv.read_stream(system.access(), "IBPOOL_POOL")
    dlq = await inv.read_stream(system.access(), "IBPOOL_DLQ")
    await observer.drain(until_seq=max((r.seq for r in pool), default=0))
    out.events_checked = len(pool) + len(job_events) + len(dlq)
    grants_after = [r.event.occurred_at for r in pool if isinstance(r.event, AllocationGranted)
                    and last_fault_at is not None and r.event.occurred_at > last_fault_at]  # fmt: skip
    if grants_after and last_fault_at is not None:
        out.recover_s = (min(grants_after) - last_fault_at).total_seconds()

    dead_subjects = set(FLOODED) if flooded else set()
    if plan is not None:
        dead_subjects |= plan.stored_subjects
    out.verdicts = [
        inv.every_job_completed(jobs, job_events),
        inv.capacity_from_stream(pool),
        await inv.capacity_from_ledger(system.postgres_dsn),
        inv.no_job_held_twice(pool),
        inv.killed_work_regranted(killed_nodes, job_events, require_requeue=not failover_killed),
        inv.subscriber_saw_everything(pool, observer.seen),
        await inv.outbox_drained(system.postgres_dsn),
        inv.dead_letters(dlq, dead_subjects, {s: FLOOD_PER_SUBJECT for s in CONSUMED} if flooded else {}),
        await recovered(system),
    ]
    if plan is not None and report is not None:
        health = await inv.read_stream(system.access(), "IBPOOL_HEALTH")
        out.events_checked += len(health)
        out.verdicts += [
            inv.attack_refused(report, sent=len(plan.crafted) * attack.ROUNDS),
            inv.attack_dead_lettered(dlq, report, durables_before),
            inv.attack_had_no_effect(pool + job_events + health, attack.MARK, attack.ATTACK_TERM),
            inv.durables_kept(durables_before, await inv.durables(system.access())),
        ]
    if "fencing" in extra:
        out.verdicts.append(inv.fencing_held(pool))
    if "degraded" in extra:
        out.verdicts.append(inv.degraded_not_mass_failed(await inv.read_stream(system.access(), "IBPOOL_HEALTH")))
    return out


async def aim(system: System) -> attack.Plan:
    """The attacker's plan: it holds agent 1's user; its victims are another agent's node with work
    on it now and that work's live allocation, and another agent's durable."""
    mine = system.layout.agent_grant(1)
    pool = await inv.read_stream(system.access(), "IBPOOL_POOL")
    live: dict[str, inv.Recorded] = {}
    for r in pool:
        if isinstance(r.event, AllocationGranted) and r.event.node_id not in mine.nodes:
            live[r.event.allocation_id] = r
        elif isinstance(r.event, AllocationReleased | AllocationRevoked | AllocationExpired):
            live.pop(r.event.allocation_id, None)
    grant = next(iter(reversed(live.values())), None)
    other = system.layout.agent_grant(2)
    victim = grant.event.node_id if grant is not None else other.nodes[0]
    return attack.plan(ATTACKER_HOLDS, mine, victim, grant.event if grant is not None else None, grant, other.durable)


async def recovered(system: System, timeout_s: float = 60) -> inv.Verdict:
    """Every container is up and healthy again without anyone's help (health checks run every 5 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = await asyncio.to_thread(system.health)
        bad = {r: s for r, s in health.items() if s not in ("healthy", "running")}
        if not bad or time.monotonic() > deadline:
            break
        await asyncio.sleep(2)
    return inv.Verdict("services recovered by themselves", not bad, f"{len(health) - len(bad)}/{len(health)} up"
                       + (f"; {bad}" if bad else ""))  # fmt: skip
