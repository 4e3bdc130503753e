"""Chaos in containers: SIGKILL services and node agents while jobs flow, then check nothing broke.

`make chaos` (not part of `make test`: it needs a docker daemon and the images of `make images`).
Each run starts its own docker network with nats, postgres, the pool allocator, the scheduler,
the failover controller and two node agents of 4 simulated nodes each, all from our images,
reached only through published loopback ports. A steady load of jobs is submitted to the
scheduler at a fixed rate while the faults are injected; then the load stops and the invariants
are checked against the event streams:

- no GPU was ever granted past its capacity (every grant, release, revocation and expiry on the
  pool stream replayed in order);
- every submitted job ended `completed` (requeues on the way are fine) and no job was scheduled
  twice at the same time;
- nothing went to the dead-letter stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import nats
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from ibpool_proto import decode
from ibpool_proto.job import JobFinished, JobScheduled
from ibpool_proto.pool import AllocationExpired, AllocationGranted, AllocationReleased, AllocationRevoked
from ibpool_runtime.devstack import free_port

IMAGES = ("nats", "postgres", "pool-allocator", "scheduler", "failover-controller", "node-agent")
JOBS = 30
RATE_PER_S = 2.0


def docker(*args: str, check: bool = True) -> str:
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout.strip()


@dataclass
class System:
    net: str
    names: dict[str, str]
    nats_url: str
    scheduler_url: str

    def kill(self, part: str) -> None:
        docker("kill", "--signal", "KILL", self.names[part])

    def start(self, part: str) -> None:
        docker("start", self.names[part])

    def act(self, action: str, part: str) -> None:
        """kill (SIGKILL), start, restart, pause/unpause, disconnect/connect (from the network)."""
        match action:
            case "kill":
                self.kill(part)
            case "disconnect" | "connect":
                docker("network", action, self.net, self.names[part])
            case _:
                docker(action, self.names[part])


@pytest.fixture
def system(request: pytest.FixtureRequest) -> Iterator[System]:
    """The system in containers; `request.param` (indirect parametrisation) is the failover controller's
    max_failed_fraction (default 0.5, so that losing one of the two agents fails its 4 of 8 nodes)."""
    max_failed = str(getattr(request, "param", 0.5))
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.fail("no docker daemon: start dockerd (deploy/README.md) before `make chaos`")
    missing = [i for i in IMAGES if not docker("images", "-q", f"ibpool/{i}:dev")]
    if missing:
        pytest.fail(f"images missing ({', '.join(missing)}): run `make images` first")
    run = uuid.uuid4().hex[:6]
    net = f"ibpool-chaos-{run}"
    docker("network", "create", net)
    names = {
        p: f"chaos-{run}-{p}" for p in ("nats", "postgres", "allocator", "scheduler", "failover", "agent-a", "agent-b")
    }
    common = ["--network", net, "--read-only", "--tmpfs", "/tmp"]
    env = [
        "-e", f"IBPOOL_NATS_URL=nats://{names['nats']}:4222",
        "-e", f"IBPOOL_POSTGRES_DSN=postgresql://postgres:chaos@{names['postgres']}:5432/postgres",
    ]  # fmt: skip
    try:
        nats_port, scheduler_port = free_port(), free_port()  # fixed: a restarted container keeps them
        docker(
            "run",
            "-d",
            "--name",
            names["nats"],
            "--network",
            net,
            "-p",
            f"127.0.0.1:{nats_port}:4222",
            "ibpool/nats:dev",
        )
        docker(
            "run", "-d", "--name", names["postgres"], "--network", net, "-e", "POSTGRES_PASSWORD=chaos",
            "ibpool/postgres:dev",
        )  # fmt: skip
        time.sleep(5)
        docker("run", "-d", "--name", names["allocator"], *common, *env, "ibpool/pool-allocator:dev")
        docker(
            "run", "-d", "--name", names["scheduler"], *common, *env, "-p", f"127.0.0.1:{scheduler_port}:8080",
            "ibpool/scheduler:dev",
        )  # fmt: skip
        docker(
            "run", "-d", "--name", names["failover"], *common, *env,
            "-e", "IBPOOL_FAILOVER_CONTROLLER_STABLE_WINDOW_S=3",
            "-e", f"IBPOOL_FAILOVER_CONTROLLER_MAX_FAILED_FRACTION={max_failed}",
            "ibpool/failover-controller:dev",
        )  # fmt: skip
        for agent, first in (("agent-a", 1), ("agent-b", 5)):
            docker(
                "run", "-d", "--name", names[agent], *common, *env,
                "-e", "IBPOOL_NODE_AGENT_BACKEND=simulated", "-e", "IBPOOL_NODE_AGENT_NODES=4",
                "-e", f"IBPOOL_NODE_AGENT_FIRST_NODE={first}", "-e", "IBPOOL_NODE_AGENT_NODE_PREFIX=chaos",
                "ibpool/node-agent:dev",
            )  # fmt: skip
        sys_ = System(
            net=net,
            names=names,
            nats_url=f"nats://127.0.0.1:{nats_port}",
            scheduler_url=f"http://127.0.0.1:{scheduler_port}",
        )
        yield sys_
    finally:
        for n in names.values():
            docker("rm", "-f", n, check=False)
        docker("network", "rm", net, check=False)


async def _ready(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(f"{url}/v1/scheduler") as r:
                    if r.status == 200 and (await r.json())["nodes"] >= 8:
                        return
            except (aiohttp.ClientError, TimeoutError, KeyError):
                pass
            await asyncio.sleep(1)
    raise AssertionError(f"the scheduler at {url} did not see 8 nodes within {timeout_s} s")


async def _stream(url: str, stream: str, raw: bool = False) -> list[Any]:
    """Every message of `stream`, decoded (or as NATS messages with `raw`)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        if info.state.messages == 0:
            return []
        sub = await js.pull_subscribe(">", stream=stream, config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))
        out: list[Any] = []
        seen = 0
        while seen < info.state.messages:
            try:
                batch = await sub.fetch(500, timeout=2)
            except nats.errors.TimeoutError:
                break
            seen += len(batch)
            for m in batch:
                if raw:
                    out.append(m)
                else:
                    with contextlib.suppress(Exception):  # a flooded malformed body is not an event
                        out.append(decode(m.data))
        return out
    finally:
        await nc.close()


def _never_over_capacity(events: list[object]) -> None:
    """Replay the pool stream: at no point may a GPU carry more than 1000 milli of live grants."""
    live: dict[tuple[str, str], list[tuple[tuple[str, int], int]]] = {}
    load: dict[tuple[str, int], int] = defaultdict(int)
    for ev in events:
        match ev:
            case AllocationGranted():
                shares = [((a.node_id, a.gpu_index), a.milli) for a in ev.assignments if a.node_id == ev.node_id]
                live[(ev.allocation_id, ev.node_id)] = shares
                for gpu, milli in shares:
                    load[gpu] += milli
                    assert load[gpu] <= 1000, f"{gpu} granted {load[gpu]} milli at {ev.allocation_id}"
            case AllocationReleased() | AllocationRevoked() | AllocationExpired():
                for gpu, milli in live.pop((ev.allocation_id, ev.node_id), []):
                    load[gpu] -= milli


async def _submit(http: aiohttp.ClientSession, url: str, body: dict[str, object]) -> None:
    """POST the job, retrying while the scheduler is down (a client would); the job id makes a repeat harmless."""
    deadline = time.monotonic() + 90
    while True:
        try:
            async with http.post(f"{url}/v1/jobs", json=body) as r:
                assert r.status in (200, 201), await r.text()
                return
        except (aiohttp.ClientError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _load(system: System, faults: list[tuple[float, str, str]]) -> list[str]:
    """Submit JOBS jobs at RATE_PER_S while the faults (at seconds, action, part) run on their own timeline."""
    started = time.monotonic()

    async def inject() -> None:
        for at, action, part in sorted(faults):
            await asyncio.sleep(max(0.0, at - (time.monotonic() - started)))
            if action == "flood":
                await _flood(system.nats_url)
            else:
                await asyncio.to_thread(system.act, action, part)

    async def submit_all() -> list[str]:
        jobs = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            for i in range(JOBS):
                job = f"chaos-{i:03d}"
                body = {"id": job, "tenant": "chaos", "gpus": 1 + i % 4, "workload": {"simulated_runtime_s": 2 + i % 3}}
                await _submit(http, system.scheduler_url, body)
                jobs.append(job)
                await asyncio.sleep(1 / RATE_PER_S)
        return jobs

    _, jobs = await asyncio.gather(inject(), submit_all())
    return jobs


FLOODED = (
    "ibpool.pool.placement.propose.x",
    "ibpool.pool.allocation.request.x",
    "ibpool.job.job.submit.x",
    "ibpool.node.node.registered.x",
    "ibpool.health.node.failed.x",
    "ibpool.fabric.topology.published.x",
)


async def _flood(url: str, per_subject: int = 50) -> None:
    """Malformed bodies on the subjects services consume: broken JSON, wrong types, unknown tags."""
    bodies = [b"{not json", b'{"type": "io.ibpool.pool.placement.propose.v1", "job_id": 7}', b'{"type": "nope.v9"}']
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for subject in FLOODED:
            for i in range(per_subject):
                await js.publish(subject, bodies[i % len(bodies)], headers={"Nats-Msg-Id": f"flood-{subject}-{i}"})
    finally:
        await nc.close()


async def _all_completed_nothing_overcommitted(system: System, jobs: list[str], dlq_allowed: bool = False) -> None:
    deadline = time.monotonic() + 240
    finished: dict[str, str] = {}
    while time.monotonic() < deadline:
        events = await _stream(system.nats_url, "IBPOOL_JOB")
        finished = {e.job_id: e.state for e in events if isinstance(e, JobFinished)}
        if set(jobs) <= set(finished):
            break
        await asyncio.sleep(3)
    states = {j: finished.get(j, "not finished") for j in jobs}
    assert all(s == "completed" for s in states.values()), json.dumps(states, indent=1)
    _never_over_capacity(await _stream(system.nats_url, "IBPOOL_POOL"))
    scheduled = {e.job_id for e in await _stream(system.nats_url, "IBPOOL_JOB") if isinstance(e, JobScheduled)}
    assert scheduled >= set(jobs)
    dead = await _stream(system.nats_url, "IBPOOL_DLQ", raw=True)
    if dlq_allowed:
        assert dead and {m.headers["ibpool-dlq-subject"] for m in dead} <= set(FLOODED)
    else:
        assert dead == []


async def test_services_and_agents_killed_under_load_lose_nothing_and_grant_nothing_twice(system: System) -> None:
    await _ready(system.scheduler_url)
    faults = [
        (3.0, "kill", "allocator"),
        (6.0, "start", "allocator"),
        (8.0, "kill", "agent-b"),
        (14.0, "start", "agent-b"),
        (10.0, "kill", "scheduler"),
        (12.0, "start", "scheduler"),
    ]
    jobs = await _load(system, faults)
    await _all_completed_nothing_overcommitted(system, jobs)


async def test_every_service_and_agent_killed_at_once(system: System) -> None:
    await _ready(system.scheduler_url)
    parts = ("allocator", "scheduler", "failover", "agent-a", "agent-b")
    faults = [(5.0, "kill", p) for p in parts] + [(9.0, "start", p) for p in parts]
    jobs = await _load(system, faults)
    await _all_completed_nothing_overcommitted(system, jobs)


async def test_postgres_restarted_under_load(system: System) -> None:
    await _ready(system.scheduler_url)
    jobs = await _load(system, [(5.0, "restart", "postgres")])
    await _all_completed_nothing_overcommitted(system, jobs)


async def test_a_flood_of_malformed_events_is_dead_lettered_and_work_goes_on(system: System) -> None:
    await _ready(system.scheduler_url)
    jobs = await _load(system, [(4.0, "flood", "")])
    await _all_completed_nothing_overcommitted(system, jobs, dlq_allowed=True)


@pytest.mark.parametrize("system", [0.2], indirect=True)
async def test_a_partitioned_agent_is_not_mass_failed(system: System) -> None:
    """Half the nodes unreachable is more than the 20% the controller may fail at once: ClusterDegraded,
    no node failed, no requeue; their work goes on once the partition heals."""
    await _ready(system.scheduler_url)
    jobs = await _load(system, [(4.0, "disconnect", "agent-b"), (16.0, "connect", "agent-b")])
    await _all_completed_nothing_overcommitted(system, jobs)
    health = await _stream(system.nats_url, "IBPOOL_HEALTH")
    kinds = {type(e).__name__ for e in health}
    assert "ClusterDegraded" in kinds and "ClusterRestored" in kinds, kinds
    assert not [e for e in health if type(e).__name__ in ("NodeFailed", "RequeueRequested")]
