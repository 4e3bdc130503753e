"""`ibpool run`: the main job.

Starts the embedded stack and every service that exists (each as its own process, as an
operator would), a simulated cluster of node agents on a generated rail-optimised fabric,
watches every event on the bus, and shows it live. The finite scenario (default) asks the pool
allocator for every kind of allocation, injects link faults into the simulated fabric and clears
them, SIGKILLs the agent of one more node (in its own process) and starts it again, and ends with
a summary and exit code 0 when everything held; `--serve` keeps the system up until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
import msgspec
import nats
from nats.aio.msg import Msg
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from ibpool_autoscaler.loadgen import LoadRamp
from ibpool_core.fabric.generators import SUPERPOD_SU_SIZE
from ibpool_core.fabric.index import FabricIndex
from ibpool_core.fabric.model import Topology
from ibpool_proto import decode
from ibpool_proto.fabric import LinkDegraded, LinkRecovered, LinkStateChanged, TopologyPublished
from ibpool_proto.health import Cordoned, NodeFailed, NodeRecovered, NodeSuspected
from ibpool_proto.job import JobExited, JobFinished, JobQueued, JobScheduled, JobStarted
from ibpool_proto.message import every_subject
from ibpool_proto.node import NodeDeregistered, NodeHeartbeat, NodeRegistered
from ibpool_proto.pool import AllocationExpired, AllocationGranted, AllocationReleased, AllocationRevoked
from ibpool_proto.scale import ElasticJobResized, ScaleDecided
from ibpool_proto.slurm import SlurmNodeChanged
from ibpool_runtime import devstack, slurmstack
from ibpool_runtime.bus import Bus, redact_url
from ibpool_runtime.bus_permissions import AgentGrant, agent_grant
from ibpool_runtime.discovery import ServiceView
from ibpool_runtime.discovery import services as services_on_the_bus
from ibpool_runtime.grant_signing import SIGNER_HEADER, new_seed, public_key_of

from . import measure
from .streams import ensure_streams

HEARTBEAT_DEADLINE_S = 10.0
SOURCE = "ibpool-run"


class Restarts:
    """When `ibpool run --serve` starts a service that died again: after `first_s`, doubling with
    each death that comes within `reset_after_s` of its last start (a crash loop backs off up to
    `max_s`); a service that ran longer than that starts again after `first_s`."""

    def __init__(self, first_s: float = 1.0, max_s: float = 30.0, reset_after_s: float = 60.0) -> None:
        self.first_s, self.max_s, self.reset_after_s = first_s, max_s, reset_after_s
        self.count: dict[str, int] = {}  # name -> restarts so far
        self._delay: dict[str, float] = {}  # name -> the backoff its next death gets
        self._started: dict[str, float] = {}  # name -> when it was last started
        self._due: dict[str, float] = {}  # name -> when to start it again (dead, waiting)

    def started(self, name: str, now: float) -> None:
        self._started[name] = now
        self._due.pop(name, None)

    def died(self, name: str, now: float) -> float:
        """Note a death (once per death); returns when to start it again."""
        if name in self._due:
            return self._due[name]
        ran = now - self._started.get(name, now)
        delay = self.first_s if ran >= self.reset_after_s else self._delay.get(name, self.first_s)
        self._delay[name] = min(self.max_s, delay * 2)
        self._due[name] = now + delay
        return self._due[name]

    def due(self, now: float) -> list[str]:
        """The dead services whose wait is over, by name; each counted as restarted."""
        out = sorted(n for n, at in self._due.items() if at <= now)
        for n in out:
            self.count[n] = self.count.get(n, 0) + 1
        return out

    def waiting(self) -> dict[str, float]:
        return dict(self._due)

    def text(self) -> str:
        """What the view shows: each restarted service and how often."""
        return ", ".join(f"{n} {c}x" for n, c in sorted(self.count.items()))


@dataclass
class ServiceProcess:
    """One service of the system, run as its own process with its own log file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    @classmethod
    def of(
        cls,
        service: str,
        base: dict[str, str],
        state: Path,
        *,
        name: str | None = None,
        instance: str = "run",
        args: Sequence[str] = (),
        **settings: str,
    ) -> ServiceProcess:
        """`python -m ibpool_<service>` on a free port, its log in `state`; `settings` are its config
        fields (`IBPOOL_<SERVICE>_<FIELD>`) on top of the environment `base`."""
        prefix = f"IBPOOL_{service.upper()}_"
        port = devstack.free_port()
        env = base | {f"{prefix}HTTP_PORT": str(port), f"{prefix}INSTANCE": instance}
        env |= {prefix + field: value for field, value in settings.items()}
        name = name or service
        return cls(name=name, argv=[f"ibpool_{service}", *args], env=env, port=port, log_path=state / f"{name}.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        if self._log is not None and not self._log.closed:
            self._log.close()  # the last run's (a restart)
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *self.argv],
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def ready(self, http: aiohttp.ClientSession) -> bool:
        """It is up and ready (GET /readyz is 200); a slow start is not an error. What callers wait
        for before sending it work: the scheduler, loading its runtime model's libraries, may be
        seconds later than the others."""
        try:
            async with http.get(f"{self.url}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    def terminate(self) -> None:
        if self.running():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL, as a crashed node would go: no deregistration, nothing flushed."""
        if self.running():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()
        if self._log is not None:
            self._log.close()

    def wait(self, timeout_s: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
        finally:
            if self._log is not None:
                self._log.close()
        return self.proc.returncode


@dataclass
class Observed:
    """What the run saw on the bus."""

    started: float = field(default_factory=time.monotonic)
    by_type: collections.Counter[str] = field(default_factory=collections.Counter)
    registered: set[str] = field(default_factory=set)
    deregistered: set[str] = field(default_factory=set)
    heartbeating: dict[str, float] = field(default_factory=dict)
    heartbeat_times: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=100_000))
    all_heartbeating_after: float | None = None
    jobs_started: int = 0
    exits: collections.Counter[str] = field(default_factory=collections.Counter)
    topology: TopologyPublished | None = None
    link_state: dict[str, str] = field(default_factory=dict)
    degraded: collections.Counter[str] = field(default_factory=collections.Counter)
    recovered: set[str] = field(default_factory=set)
    link_downs: int = 0
    # node id -> when (run seconds) the failover controller suspected, failed and recovered it
    suspected: dict[str, float] = field(default_factory=dict)
    failed: dict[str, float] = field(default_factory=dict)
    recovered_nodes: dict[str, float] = field(default_factory=dict)
    cordons: collections.Counter[str] = field(default_factory=collections.Counter)
    # the scheduler's jobs: queued, scheduled (granted) and finished by final state
    jobs_queued: set[str] = field(default_factory=set)
    jobs_scheduled: set[str] = field(default_factory=set)
    jobs_finished: dict[str, str] = field(default_factory=dict)
    # job id -> when (run seconds) its first JobQueued and JobScheduled were seen
    queued_at: dict[str, float] = field(default_factory=dict)
    scheduled_at: dict[str, float] = field(default_factory=dict)
    # the inference deployment's replica targets, in the order the autoscaler chose them
    replica_targets: list[int] = field(default_factory=list)
    # the elastic training job's worker counts after each resize
    elastic_sizes: list[int] = field(default_factory=list)
    total: int = 0
    undecodable: int = 0
    # grants (and revocations, releases, expiries) by whether they carry a signature header
    signed: int = 0
    unsigned: int = 0
    # --slurm: node id -> when (run seconds) Slurm first showed it drained by ibpool, and then resumed
    slurm_drained: dict[str, float] = field(default_factory=dict)
    slurm_resumed: dict[str, float] = field(default_factory=dict)

    def heartbeats_per_s(self, window: float = 5.0) -> float:
        now = time.monotonic()
        return sum(1 for t in self.heartbeat_times if now - t <= window) / window

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def links_not_up(self) -> dict[str, str]:
        return {k: v for k, v in self.link_state.items() if v != "up"}


def _observer(obs: Observed, expected_nodes: int):  # type: ignore[no-untyped-def]
    heartbeat = NodeHeartbeat.ce_type()

    def beat(node_id: str) -> None:
        now = time.monotonic()
        obs.heartbeating[node_id] = now
        obs.heartbeat_times.append(now)
        if obs.all_heartbeating_after is None and len(obs.heartbeating) >= expected_nodes:
            obs.all_heartbeating_after = obs.elapsed()

    async def on_msg(msg: Msg) -> None:
        obs.total += 1
        ce_type = (msg.headers or {}).get("ce-type", "?")
        obs.by_type[ce_type] += 1
        if ce_type == heartbeat:
            # One per node per second (12,500 a second at 100,000 GPUs): the node is the subject's
            # key, not decoded, so this reader keeps up with the bus (decoding every beat, it was
            # dropped by nats-server at 12,500 nodes and missed the scenario's events).
            beat(msg.subject.rsplit(".", 1)[-1])
            return
        try:
            ev = decode(msg.data)
        except Exception:
            obs.undecodable += 1
            return
        match ev:
            case NodeRegistered():
                obs.registered.add(ev.node_id)
            case NodeDeregistered():
                obs.deregistered.add(ev.node_id)
            case NodeHeartbeat():
                beat(ev.node_id)
            case AllocationGranted() | AllocationRevoked() | AllocationReleased() | AllocationExpired():
                if (msg.headers or {}).get(SIGNER_HEADER):
                    obs.signed += 1
                else:
                    obs.unsigned += 1
            case JobStarted():
                obs.jobs_started += 1
            case JobExited():
                obs.exits[ev.reason] += 1
            case TopologyPublished():
                obs.topology = ev
            case LinkStateChanged():
                obs.link_state[ev.link_id] = ev.state
                obs.link_downs += ev.state == "down"
            case LinkDegraded():
                obs.degraded[str(ev.problem)] += 1
            case LinkRecovered():
                obs.recovered.add(ev.link_id)
            case NodeSuspected():
                obs.suspected.setdefault(ev.node_id, obs.elapsed())
            case NodeFailed():
                obs.failed.setdefault(ev.node_id, obs.elapsed())
            case NodeRecovered():
                obs.recovered_nodes[ev.node_id] = obs.elapsed()
            case Cordoned():
                obs.cordons[ev.scope] += 1
            case JobQueued():
                obs.jobs_queued.add(ev.job_id)
                obs.queued_at.setdefault(ev.job_id, obs.elapsed())
            case JobScheduled():
                obs.jobs_scheduled.add(ev.job_id)
                obs.scheduled_at.setdefault(ev.job_id, obs.elapsed())
            case JobFinished():
                obs.jobs_finished[ev.job_id] = ev.state
            case ScaleDecided():
                obs.replica_targets.append(ev.target_replicas)
            case ElasticJobResized():
                obs.elastic_sizes.append(ev.workers_to)
            case SlurmNodeChanged():
                if ev.drained_by_ibpool:
                    obs.slurm_drained.setdefault(ev.node_id, obs.elapsed())
                elif ev.node_id in obs.slurm_drained and "DRAIN" not in ev.state:
                    obs.slurm_resumed.setdefault(ev.node_id, obs.elapsed())
            case _:
                pass

    return on_msg


def _view(
    obs: Observed, nodes: int, phase: str, pool: PoolSeen | None = None, sched: SchedulerSeen | None = None
) -> Group:
    head = Table.grid(padding=(0, 2))
    head.add_row("phase", phase, "elapsed", f"{obs.elapsed():5.1f} s")
    alive = sum(1 for t in obs.heartbeating.values() if time.monotonic() - t < 3.0)
    head.add_row("nodes registered", f"{len(obs.registered)}/{nodes}", "heartbeating now", f"{alive}/{nodes}")
    head.add_row("heartbeats/s", f"{obs.heartbeats_per_s():.1f}", "events on the bus", str(obs.total))
    first = obs.all_heartbeating_after
    head.add_row(
        "all heartbeating after",
        "-" if first is None else f"{first:.2f} s",
        "jobs started / exited",
        f"{obs.jobs_started} / {sum(obs.exits.values())}",
    )
    topo = obs.topology
    head.add_row(
        "fabric",
        "-" if topo is None else f"v{topo.version}: {topo.hosts} hosts, {topo.switches} switches, {topo.links} links",
        "links not up",
        ", ".join(f"{s} {n}" for s, n in sorted(collections.Counter(obs.links_not_up().values()).items())) or "none",
    )
    finished = collections.Counter(obs.jobs_finished.values())
    head.add_row(
        "scheduler jobs queued / scheduled",
        f"{len(obs.jobs_queued)} / {len(obs.jobs_scheduled)}",
        "finished",
        ", ".join(f"{k} {v}" for k, v in sorted(finished.items())) or "none",
    )
    if sched is not None:
        head.add_row("scheduler queues", sched.queue_lines(), "scheduler decisions", sched.decision())
    head.add_row(
        "inference replicas (autoscaler)",
        " -> ".join(map(str, obs.replica_targets[-6:])) or "-",
        "elastic training workers",
        " -> ".join(map(str, obs.elastic_sizes[-6:])) or "-",
    )
    head.add_row(
        "nodes suspected / failed / recovered",
        f"{len(obs.suspected)} / {len(obs.failed)} / {len(obs.recovered_nodes)}",
        "cordons",
        ", ".join(f"{k} {v}" for k, v in sorted(obs.cordons.items())) or "none",
    )
    if pool is not None:
        head.add_row(
            "pool allocated",
            pool.utilisation(),
            "direct grants / rejections",  # the demo's own allocation requests, not the scheduler's grants
            f"{pool.granted} / {sum(pool.rejected.values())}",
        )
        head.add_row(
            "pool fragmentation",
            pool.fragmentation(),
            "allocator's fabric",
            "-" if pool.fabric_version is None else f"v{pool.fabric_version}, {pool.leaf_groups} leaf groups",
        )
    types = Table(title="events by type", show_edge=False)
    types.add_column("ce-type")
    types.add_column("count", justify="right")
    for t, n in sorted(obs.by_type.items()):
        types.add_row(t, str(n))
    return Group(head, types)


GANG_JOB, REMOTE_JOB, BUSY_JOB = "job-07", "job-09", "job-03"
SPARE_AGENT = "node_agent_spare"
NODE_PREFIX = "node"


def _agent_layout(args: argparse.Namespace) -> dict[str, tuple[str, int, int]]:
    """The run's agent processes: each one's NATS user of its own (allowed only its nodes:
    bus_permissions.agent_permissions), first node and node count. The cluster's nodes, and the
    spare the scenario kills."""
    return {"node_agent": ("agent-main", 1, args.nodes), SPARE_AGENT: ("agent-spare", args.nodes + 1, 1)}


def _agents(args: argparse.Namespace) -> dict[str, AgentGrant]:
    """The agents' grants by their NATS users, for the stack to enrol."""
    return {user: agent_grant(NODE_PREFIX, first, count) for user, first, count in _agent_layout(args).values()}


# An inference deployment the autoscaler sizes to the load ramp the scenario publishes (5 -> 35 -> 5 req/s,
# 10 req/s per replica), with short windows so the scale-down shows within the run.
DEMO_DEPLOYMENT = {
    "tenant": "demo",
    "min_replicas": 1,
    "max_replicas": 4,
    "gpus": 1,
    "targets": {"requests_per_s": 10},
    "reactive": {"metric_window_s": 5, "scale_down_window_s": 5, "down_percent": 100, "down_period_s": 2},
}
# An elastic training job below everything else: the autoscaler grows it into GPUs left idle and
# shrinks it whenever work of higher priority waits.
DEMO_ELASTIC_JOB = {"tenant": "demo", "priority": -10, "min_workers": 1, "max_workers": 4, "gpus_per_worker": 1}


def _allocation_asks(seed: int) -> list[dict[str, object]]:
    """What the scenario asks the pool allocator for: every kind of allocation, one over its memory.

    The remote client is the node of the 8-GPU job-03, or of the gang job-07 when job-03 went to the
    spare, off the fabric (filled in when they are granted): with no GPU free there, the grant comes
    from another node, as near as the allocator finds one."""
    rng = random.Random(seed)

    def ask(i: int, request: dict[str, object], runtime: float, memory: int | None = None) -> dict[str, object]:
        return {
            "job_id": f"job-{i:02d}",
            "tenant": "team-a" if i % 2 else "team-b",
            "queue": "default",
            "request": request,
            "lease_s": 600,
            "workload": {"simulated_runtime_s": runtime, "simulated_memory_mib": memory},
        }

    asks = [ask(i, {"kind": "whole", "gpus": g}, rng.uniform(8, 20)) for i, g in enumerate((1, 2, 4, 8))]
    asks += [
        ask(4, {"kind": "fraction", "milli": 500, "memory_mib": 20_000}, rng.uniform(8, 20), memory=10_000),
        # asks for more memory than its slice: the node agent enforces the limit (OOM)
        ask(5, {"kind": "fraction", "milli": 250, "memory_mib": 10_000}, 30, memory=30_000),
        ask(6, {"kind": "mig", "mig_profile": "3g.40gb"}, rng.uniform(8, 20)),
        ask(7, {"kind": "gang", "hosts": 2, "gpus": 8}, rng.uniform(8, 20)),
        ask(8, {"kind": "whole", "gpus": 8}, 600),  # released by the scenario while it runs
        ask(9, {"kind": "remote", "milli": 500, "memory_mib": 20_000}, rng.uniform(8, 20)) | {"client_node_id": None},
    ]
    return asks


# The scheduler's gang that no leaf group of the fabric can hold (5 hosts, groups of 4): it must wait.
NEVER_FITS_JOB = "wide-gang"


# Up to this many nodes the scenario's fabric is shaped and polled for a small demonstration.
SMALL_CLUSTER_NODES = 128


def su_size_for(nodes: int) -> int:
    """Hosts per scalable unit (leaf group) of the generated fabric: 4 in a small cluster, so it has
    leaf groups for gangs to pack into, and the DGX SuperPOD's 32 beyond (with 4, a 5,000-node
    fabric had 10,000 leaves of 4 hosts and 32 uplinks each: 687,680 links, 5.7 times those of the
    SuperPOD shape)."""
    return 4 if nodes <= SMALL_CLUSTER_NODES else SUPERPOD_SU_SIZE


def _scheduler_jobs(seed: int, su_size: int = 4) -> list[dict[str, object]]:
    """The mixed workload submitted to the scheduler: gangs with required topology constraints (a
    2-host training gang under one leaf group, a 6-host one under one spine group, and one of
    `su_size` + 1 hosts under one leaf group that never fits and must wait), small jobs, inference
    slices."""
    rng = random.Random(seed + 1)

    def job(name: str, runtime: float, **shape: object) -> dict[str, object]:
        return {"id": name, "name": name, "tenant": "team-a", "workload": {"simulated_runtime_s": runtime}} | shape

    def tier(level: int) -> dict[str, object]:
        return {"topology": {"constraint": "required", "level": level}}

    jobs = [job("train-gang", rng.uniform(3, 5), hosts=2, gpus_per_host=8, priority=10, **tier(1))]
    jobs += [job("spine-gang", rng.uniform(3, 5), hosts=6, gpus_per_host=2, **tier(2))]
    jobs += [job(NEVER_FITS_JOB, 60.0, hosts=su_size + 1, gpus_per_host=1, **tier(1))]
    jobs += [job(f"small-{i}", rng.uniform(2, 4), gpus=rng.choice((1, 2, 4))) for i in range(4)]
    jobs += [job(f"infer-{i}", rng.uniform(2, 4), fraction=0.25, memory_mib=10_000) for i in range(2)]
    return jobs


async def _submit_jobs(http: aiohttp.ClientSession, url: str, seed: int, su_size: int) -> int:
    accepted = 0
    for body in _scheduler_jobs(seed, su_size):
        async with http.post(f"{url}/v1/jobs", json=body) as r:
            accepted += r.status in (200, 201, 202)
    return accepted


@dataclass
class GangsSeen:
    """Every multi-node placement of the scheduler (GET /v1/jobs), checked against the fabric
    monitor's topology: the tier of the smallest switch group holding its hosts
    (`FabricIndex.covering_subtree`) against the tier its job required, and whether a placement
    with SHARP holds SHARP trees."""

    placed: int = 0
    # job id -> (required tier or None, the tier its hosts are under or None, the fabric version it was decided on)
    tiers: dict[str, tuple[int | None, int | None, int | None]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    sharp: int = 0
    sharp_without_trees: list[str] = field(default_factory=list)
    # the gang that must wait: its state and reason when last read
    waiting: tuple[str, str] | None = None

    def tiers_line(self) -> str:
        parts = [
            f"{j}: tier {got}" + (f" (required {want})" if want is not None else "")
            for j, (want, got, _) in sorted(self.tiers.items())
        ]
        return ", ".join(parts) or "-"


async def _read_gangs(http: aiohttp.ClientSession, sched_url: str, fabric_url: str) -> GangsSeen | None:
    """`GangsSeen` of every job the scheduler knows (live or ended); None when either service does not answer."""
    try:
        async with http.get(f"{fabric_url}/v1/topology", timeout=aiohttp.ClientTimeout(total=10)) as r:
            topology = msgspec.json.decode(await r.read(), type=Topology)
        async with http.get(f"{sched_url}/v1/jobs?limit=10000", timeout=aiohttp.ClientTimeout(total=10)) as r:
            jobs = (await r.json()) if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError):
        return None
    if jobs is None:
        return None
    index = FabricIndex(topology)
    known = set(index.hosts)
    seen = GangsSeen()
    for job in jobs:
        if job["job_id"] == NEVER_FITS_JOB:
            seen.waiting = (job["state"], job["reason"])
        placement = job.get("placement")
        hosts = placement["ranks"] if placement else []
        if len(hosts) < 2:
            continue
        seen.placed += 1
        cover = index.covering_subtree(hosts) if set(hosts) <= known else None
        got = cover.level if cover is not None else None
        want = job["topology_level"] if job["topology"] == "required" else None
        seen.tiers[job["job_id"]] = (want, got, placement.get("fabric_version"))
        if want is not None and (got is None or got > want):
            seen.violations.append(f"{job['job_id']} on {','.join(hosts)}: tier {got}, required {want}")
        if placement["sharp"]:
            seen.sharp += 1
            if not placement.get("sharp_tree") or not placement.get("nccl_env"):
                seen.sharp_without_trees.append(job["job_id"])
    return seen


@dataclass
class PoolSeen:
    """The pool allocator as the run last read it (GET /v1/pool)."""

    nodes: int = 0
    capacity_milli: int = 0
    allocated_milli: int = 0
    ledger_version: int = 0
    granted: int = 0
    rejected: collections.Counter[str] = field(default_factory=collections.Counter)
    allocation_ids: dict[str, str] = field(default_factory=dict)
    # job id -> the nodes of its grant, and a remote grant's client and hops
    grant_nodes: dict[str, list[str]] = field(default_factory=dict)
    remote: tuple[str, int | None] | None = None
    free_milli: int = 0
    fragmentation_milli: int = 0
    fragmentation_measure: str = ""
    fabric_version: int | None = None
    leaf_groups: int = 0
    # how many leaf groups of the published fabric the gang's hosts are under
    gang_leaf_groups: int | None = None

    def utilisation(self) -> str:
        if not self.capacity_milli:
            return "-"
        share = self.allocated_milli / self.capacity_milli
        return f"{share:.1%} of {self.capacity_milli // 1000} GPUs (ledger v{self.ledger_version})"

    def fragmentation(self) -> str:
        if not self.capacity_milli:
            return "-"
        measure = {"fgd": "FGD, learned mix", "partial_free": "partly granted GPUs"}.get(
            self.fragmentation_measure, self.fragmentation_measure
        )
        return f"{self.fragmentation_milli / 1000:.2f} of {self.free_milli / 1000:.2f} free GPUs ({measure})"


async def _read_pool(http: aiohttp.ClientSession, url: str, seen: PoolSeen) -> None:
    try:
        async with http.get(f"{url}/v1/pool", timeout=aiohttp.ClientTimeout(total=2)) as r:
            if r.status != 200:
                return
            body = await r.json()
    except (aiohttp.ClientError, TimeoutError):
        return
    seen.nodes = len(body["nodes"])
    seen.capacity_milli = sum(m["capacity_milli"] for m in body["models"])
    seen.allocated_milli = sum(m["allocated_milli"] for m in body["models"])
    seen.free_milli = sum(m["free_milli"] for m in body["models"])
    seen.fragmentation_milli = sum(m.get("fragmentation_milli", 0) for m in body["models"])
    seen.fragmentation_measure = body.get("fragmentation_measure", "")
    seen.ledger_version = body["ledger_version"]
    fabric = body.get("fabric")
    if fabric is not None:
        seen.fabric_version, seen.leaf_groups = fabric["version"], fabric["leaf_groups"]


@dataclass
class SchedulerSeen:
    """The scheduler as the run last read it: its queues (GET /v1/queues) and its decisions
    (GET /v1/scheduler: cycles run, the order the policy chose in the last one, e.g. "priority")."""

    queues: list[dict[str, Any]] = field(default_factory=list)
    cycles: int = 0
    last_order: str = ""

    def queue_lines(self) -> str:
        return (
            "; ".join(
                f"{q['queue']} ({q['policy']}, {q['backfill']}): queued {q['queued']}, "
                f"running {q['proposed'] + q['scheduled'] + q['running']} ({q['running_gpus']} GPUs)"
                for q in self.queues
            )
            or "-"
        )

    def decision(self) -> str:
        return f"{self.cycles} cycles, the last ordered by {self.last_order or '-'}"


async def _read_scheduler(http: aiohttp.ClientSession, url: str, seen: SchedulerSeen) -> None:
    try:
        async with http.get(f"{url}/v1/queues", timeout=aiohttp.ClientTimeout(total=2)) as r:
            queues = await r.json() if r.status == 200 else None
        async with http.get(f"{url}/v1/scheduler", timeout=aiohttp.ClientTimeout(total=2)) as r:
            about = await r.json() if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return
    if queues is not None:
        seen.queues = queues["queues"]
    if about is not None:
        seen.cycles, seen.last_order = about["cycles"], about.get("last_order") or ""


async def _request_allocations(http: aiohttp.ClientSession, url: str, seed: int, seen: PoolSeen, spare: str) -> None:
    for ask in _allocation_asks(seed):
        job = str(ask["job_id"])
        if job == REMOTE_JOB:
            # A node the 8-GPU job or the gang filled, on the fabric: the spare is not on it (and a
            # large cluster's asks can come before most nodes registered, when the spare is free).
            full = [n for j in (BUSY_JOB, GANG_JOB) for n in seen.grant_nodes.get(j, []) if n != spare]
            ask["client_node_id"] = full[0] if full else "node-001"
        async with http.post(f"{url}/v1/allocations", json=ask) as r:
            body = await r.json()
            if r.status == 201:
                seen.granted += 1
                seen.allocation_ids[job] = body["allocation_id"]
                seen.grant_nodes[job] = [g["node_id"] for g in body["grants"]]
                if job == REMOTE_JOB:
                    seen.remote = (str(ask["client_node_id"]), body["grants"][0]["hops"])
            else:
                seen.rejected[body.get("error", str(r.status))] += 1


async def _leaf_groups_of(http: aiohttp.ClientSession, fabric_url: str, nodes: list[str]) -> int | None:
    """How many leaf groups of the fabric monitor's current topology hold `nodes`."""
    try:
        async with http.get(f"{fabric_url}/v1/topology", timeout=aiohttp.ClientTimeout(total=10)) as r:
            topology = msgspec.json.decode(await r.read(), type=Topology)
    except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError):
        return None
    group = {h: g.index for g in FabricIndex(topology).leaf_groups() for h in g.hosts}
    return len({group.get(n, -1) for n in nodes}) if nodes else None


async def _find_services(bus: Bus, services: Sequence[ServiceProcess], tries: int = 5) -> list[ServiceView]:
    """What answers the NATS service API, asked again (each time waiting its second) until every
    process of the run has answered or `tries` are spent: a process whose loop is busy (the fabric
    monitor polling a 1,000-host fabric) may answer one ask too late."""
    found: dict[str, ServiceView] = {}
    for _ in range(tries):
        found |= {v.http_url: v for v in await services_on_the_bus(bus)}
        if all(s.url in found for s in services):
            break
    return list(found.values())


def _services(
    args: argparse.Namespace, info: devstack.StackInfo, state: Path, slurm: slurmstack.Cluster | None = None
) -> list[ServiceProcess]:
    base = dict(os.environ, IBPOOL_NATS_URL=info.nats_url, IBPOOL_POSTGRES_DSN=info.postgres_dsn)
    # The failover controller sees agents' connections close through nats-server's system account.
    base["IBPOOL_FAILOVER_CONTROLLER_CONNECTION_EVENTS_URL"] = info.system_nats_url
    if info.secured:  # each service on its own NATS user, its API behind the stack's tokens
        for service in devstack.SERVICE_USERS:
            prefix = f"IBPOOL_{service.upper()}_"
            base[prefix + "NATS_URL"] = devstack.nats_url_as(info, service)
            base[prefix + "API_TOKENS_FILE"] = devstack.api_tokens_file(info)
    # The allocator signs what the agents act on; they trust its key only (a seed made for this run).
    seed_file = state / "grant-signing.seed"
    if not seed_file.exists():
        seed_file.write_text(new_seed() + "\n")
        seed_file.chmod(0o600)
    signers = json.dumps([public_key_of(seed_file.read_text().strip())])
    agents: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {}  # process name -> (argv, its own user's URL)
    for name, (user, first, count) in _agent_layout(args).items():
        argv = ("--nodes", str(count), "--first", str(first), "--seed", str(args.seed), "--prefix", NODE_PREFIX)
        agents[name] = (argv, {"NATS_URL": devstack.nats_url_as(info, user)} if info.secured else {})
    return [
        ServiceProcess.of("pool_allocator", base, state, GRANT_SIGNING_SEED_FILE=str(seed_file)),
        ServiceProcess.of(
            "fabric_monitor",
            base,
            state,
            # Scalable units of 4 hosts in a small cluster (a 16-node one has 4 leaf groups for gangs
            # to pack into), of the SuperPOD's 32 in a large one (`su_size_for`).
            GENERATE=f"rail_optimised:hosts={args.nodes},su_size={su_size_for(args.nodes)}",
            HOST_NAME_FORMAT="node-{:03d}",
            COUNTER_SOURCE="simulated",
            # A poll a second shows a small cluster's link faults at once; a large one is polled at
            # the service's default interval (5 s), as a real fabric of that size would be.
            POLL_INTERVAL_S="1" if args.nodes <= SMALL_CLUSTER_NODES else "5",
            CLEAR_AFTER_S="3",
        ),
        ServiceProcess.of(
            "node_agent",
            base,
            state,
            args=agents["node_agent"][0],
            BACKEND="simulated",
            GRANT_SIGNERS=signers,
            **agents["node_agent"][1],
        ),
        # One more node in its own agent process: the scenario SIGKILLs it and starts it again.
        ServiceProcess.of(
            "node_agent",
            base,
            state,
            name=SPARE_AGENT,
            instance="spare",
            args=agents[SPARE_AGENT][0],
            BACKEND="simulated",
            GRANT_SIGNERS=signers,
            **agents[SPARE_AGENT][1],
        ),
        # A stable window short enough to see a node come back within the scenario.
        ServiceProcess.of("failover_controller", base, state, STABLE_WINDOW_S="3"),
        ServiceProcess.of("dashboard", base, state),
        ServiceProcess.of("scheduler", base, state),
        ServiceProcess.of("autoscaler", base, state, INTERVAL_S="1"),
        *(
            # --slurm: node verdicts only drain Slurm nodes here (the scenario's link faults cordon rails)
            [
                ServiceProcess.of(
                    "slurm_bridge",
                    base,
                    state,
                    SLURM_CONF=str(slurm.conf),
                    TOPOLOGY_FILE=str(slurm.folder / "topology.conf"),
                    DRAIN_SCOPES="node",
                    SYNC_INTERVAL_S="1",
                )
            ]
            if slurm is not None
            else []
        ),
    ]


def run_main(args: argparse.Namespace) -> int:
    console = Console()
    state = Path(args.state_dir or f".ibpool/run-{time.strftime('%Y%m%d-%H%M%S')}")
    console.print(
        f"[bold]ibpool run[/]: {args.nodes} simulated nodes on the fabric and 1 spare the scenario kills "
        f"(node-{args.nodes + 1:03d}), state in {state}"
    )
    t0 = time.monotonic()
    try:
        info = devstack.up(state, secure=not args.insecure, agents=_agents(args))
    except devstack.StackError as e:
        console.print(f"[red]embedded stack failed:[/] {e}")
        return 1
    locked = (
        f"locked: a NATS user per service, API tokens and the Postgres password in {info.secrets_dir}"
        if info.secured
        else "[yellow]open (--insecure): no NATS users, no API tokens, Postgres trusts everyone[/]"
    )
    console.print(
        f"stack up in {time.monotonic() - t0:.1f} s: nats {info.nats_url}, postgres {redact_url(info.postgres_dsn)}; "
        + locked
    )
    code = 1
    with contextlib.ExitStack() as beside:
        services: list[ServiceProcess] = []
        try:
            slurm = _start_slurm(args, state, beside, console) if args.slurm else None
            services = _services(args, info, state, slurm)
            # The admin makes the streams; the services, each on its own user, find them in place.
            asyncio.run(ensure_streams(devstack.nats_url_as(info, "admin")))
            for s in services:
                s.start()
            code = asyncio.run(_scenario(args, info, services, console, slurm))
        except KeyboardInterrupt:
            code = 0
        except slurmstack.SlurmError as e:
            console.print(f"[red]--slurm: {e}[/]")
        finally:
            for s in services:
                s.terminate()
            for s in services:
                rc = s.wait()
                if rc != 0:
                    console.print(f"[red]{s.name} exited with {rc}; see {s.log_path}[/]")
                    code = 1
            devstack.down(state)
            console.print("stack stopped")
    return code


def _start_slurm(
    args: argparse.Namespace, state: Path, beside: contextlib.ExitStack, console: Console
) -> slurmstack.Cluster:
    """--slurm: a throw-away Slurm beside the run (munged, slurmctld, a slurmd per node), its nodes
    named as the run's; SlurmError when it cannot be had here."""
    why = slurmstack.unavailable()
    if why:
        raise slurmstack.SlurmError(why)
    nodes = [f"{NODE_PREFIX}-{i:03d}" for i in range(1, args.nodes + 2)]
    socket_path = beside.enter_context(slurmstack.munge(state / "munge"))
    # a first topology.conf, so slurmctld runs topology/tree; the Slurm bridge writes the fabric's
    first = f"SwitchName=boot Nodes={','.join(nodes)}\n"
    slurm = beside.enter_context(slurmstack.cluster(state / "slurm", socket_path, nodes, topology=first, slurmd=nodes))
    console.print(f"slurm: slurmctld and {len(nodes)} slurmd up, SLURM_CONF={slurm.conf}")
    return slurm


@dataclass
class FaultPlan:
    """Two faults injected into the simulated fabric during the finite scenario, then cleared."""

    inject_at: float
    clear_at: float
    faults: list[dict[str, object]] = field(default_factory=list)
    injected: bool = False
    cleared: bool = False
    # The spare agent's node: SIGKILLed at kill_at, started again at restart_at (run seconds).
    kill_at: float = 0.0
    restart_at: float = 0.0
    killed_at: float | None = None
    restarted_at: float | None = None


async def _pick_faults(http: aiohttp.ClientSession, fabric_url: str) -> list[dict[str, object]]:
    async with http.get(f"{fabric_url}/v1/topology") as r:
        topo = await r.json()
    host_ca = {c["guid"] for c in topo["cas"] if c["host"] == "node-003" and c.get("rail") == 0}
    host_link = next(ln for ln in topo["links"] if ln["a"][0] in host_ca or ln["b"][0] in host_ca)
    cas = {c["guid"] for c in topo["cas"]}
    trunk = next(ln for ln in topo["links"] if ln["a"][0] not in cas and ln["b"][0] not in cas)

    def link_id(ln: dict[str, list[object]]) -> str:
        a, b = sorted([tuple(ln["a"]), tuple(ln["b"])])
        return f"{a[0]}:{a[1]}-{b[0]}:{b[1]}"

    return [
        {"link_id": link_id(host_link), "kind": "down"},
        {"link_id": link_id(trunk), "kind": "errors", "value": 500.0},
    ]


async def _scenario(
    args: argparse.Namespace,
    info: devstack.StackInfo,
    services: list[ServiceProcess],
    console: Console,
    slurm: slurmstack.Cluster | None = None,
) -> int:
    obs = Observed()
    admin = devstack.nats_url_as(info, "admin")  # the operator's view: every subject
    nc = await nats.connect(admin, name="ibpool-run")
    await nc.subscribe(every_subject(), cb=_observer(obs, args.nodes + 1))
    bus = await Bus.connect(admin, name="ibpool-run")
    await bus.ensure_streams()
    token = devstack.api_token(info)
    http = aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"} if token else None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    by_name = {s.name: s for s in services}
    pool = PoolSeen()
    sched = SchedulerSeen()
    asked = released = served_printed = False
    submitted = 0
    ramp_task: asyncio.Task[None] | None = None
    ramp_stop = asyncio.Event()
    last_pool_read = 0.0
    alloc_url = by_name["pool_allocator"].url
    plan = (
        None
        if args.serve
        else FaultPlan(
            inject_at=0.25 * args.duration,
            clear_at=0.5 * args.duration,
            kill_at=0.4 * args.duration,
            restart_at=0.65 * args.duration,
        )
    )
    nodes = args.nodes + 1  # the fabric's hosts and the spare
    interactive = console.is_terminal
    last_line = 0.0
    deadline = None if args.serve else time.monotonic() + args.duration
    cost = _Costs(info, services) if args.measure else None
    restarts = Restarts()
    for s in services:
        restarts.started(s.name, time.monotonic())
    with Live(
        _view(obs, nodes, "starting"),
        console=console,
        refresh_per_second=4,
        transient=False,
        auto_refresh=interactive,
    ) as live:
        while not stop.is_set():
            killed = plan is not None and plan.killed_at is not None and plan.restarted_at is None
            dead = [s.name for s in services if not s.running() and not (killed and s.name == SPARE_AGENT)]
            if dead and not args.serve:
                console.print(f"[red]{', '.join(dead)} exited early[/]")
                break
            # Serving: a service that died is started again, after a backoff that grows in a crash loop.
            for name in dead:
                if name not in restarts.waiting():
                    at = restarts.died(name, time.monotonic())
                    proc = by_name[name].proc
                    code = proc.returncode if proc is not None else None
                    console.print(
                        f"[yellow]{name} exited (code {code}); starting it again in {at - time.monotonic():.0f} s"
                        f" (log: {by_name[name].log_path})[/]"
                    )
            for name in restarts.due(time.monotonic()):
                by_name[name].start()
                restarts.started(name, time.monotonic())
                console.print(f"[yellow]{name} started again (pid {by_name[name].pid})[/]")
            if deadline is not None and time.monotonic() >= deadline:
                break
            if cost is not None:
                await cost.tick(obs, bus)
            if time.monotonic() - last_pool_read >= 1.0:
                last_pool_read = time.monotonic()
                await _read_pool(http, alloc_url, pool)
                if asked:
                    await _read_scheduler(http, by_name["scheduler"].url, sched)
            # Once every node is heartbeating and in the ledger, ask the allocator for work.
            ready = pool.nodes >= nodes and pool.fabric_version is not None
            if ready and not asked and obs.all_heartbeating_after is not None:
                # The scheduler and the autoscaler take the work over HTTP: wait until both answer.
                ready = all([await by_name[n].ready(http) for n in ("scheduler", "autoscaler")])
            if not asked and obs.all_heartbeating_after is not None and ready:
                await _request_allocations(http, alloc_url, args.seed, pool, f"node-{args.nodes + 1:03d}")
                pool.gang_leaf_groups = await _leaf_groups_of(
                    http, by_name["fabric_monitor"].url, pool.grant_nodes.get(GANG_JOB, [])
                )
                asked = True
                submitted = await _submit_jobs(http, by_name["scheduler"].url, args.seed, su_size_for(args.nodes))
                async with http.put(f"{by_name['autoscaler'].url}/v1/deployments/chat", json=DEMO_DEPLOYMENT) as r:
                    r.raise_for_status()
                async with http.put(f"{by_name['autoscaler'].url}/v1/elastic-jobs/train", json=DEMO_ELASTIC_JOB) as r:
                    r.raise_for_status()
                ramp_length = 120.0 if args.serve else 0.75 * args.duration
                ramp = LoadRamp(bus, "chat", duration_s=ramp_length, base=5, peak=35)
                ramp_task = asyncio.create_task(ramp.run(ramp_stop))
            if asked and not released and obs.jobs_started >= pool.granted and "job-08" in pool.allocation_ids:
                async with http.delete(f"{alloc_url}/v1/allocations/{pool.allocation_ids['job-08']}") as r:
                    r.raise_for_status()
                released = True
            if plan is not None and obs.topology is not None:
                fabric = by_name["fabric_monitor"].url
                if not plan.injected and obs.elapsed() >= plan.inject_at:
                    plan.faults = await _pick_faults(http, fabric)
                    for f in plan.faults:
                        async with http.post(f"{fabric}/v1/sim/faults", json=f) as r:
                            r.raise_for_status()
                    plan.injected = True
                if plan.injected and not plan.cleared and obs.elapsed() >= plan.clear_at:
                    for f in plan.faults:
                        async with http.delete(f"{fabric}/v1/sim/faults/{f['link_id']}") as r:
                            r.raise_for_status()
                    plan.cleared = True
                if plan.killed_at is None and obs.elapsed() >= plan.kill_at:
                    by_name[SPARE_AGENT].kill()
                    plan.killed_at = obs.elapsed()
                if plan.killed_at is not None and plan.restarted_at is None and obs.elapsed() >= plan.restart_at:
                    by_name[SPARE_AGENT].start()
                    plan.restarted_at = obs.elapsed()
            if args.serve and not served_printed and obs.all_heartbeating_after is not None:
                for s in services:
                    api = "/health" if s.name == "failover_controller" else "/v1"
                    what = "the web UI at /" if s.name == "dashboard" else f"API under {api}"
                    console.print(f"{s.name:<16} {s.url}  pid {s.pid}  (/healthz /readyz /metrics, {what})")
                console.print(f"{'nats':<16} {info.nats_url}  monitor {info.nats_monitor_url}")
                console.print(f"{'postgres':<16} {redact_url(info.postgres_dsn)}")
                served_printed = True
            phase = "serving (Ctrl-C to stop)" if args.serve else "scenario"
            if restarts.count or restarts.waiting():
                waiting = ", ".join(sorted(restarts.waiting()))
                phase += f": restarted {restarts.text() or 'none yet'}" + (f"; down: {waiting}" if waiting else "")
            if plan is not None and plan.injected and not plan.cleared:
                phase += ": link faults injected"
            if plan is not None and plan.killed_at is not None and plan.restarted_at is None:
                phase += f": node-{nodes:03d}'s agent killed"
            if interactive:
                live.update(_view(obs, nodes, phase, pool, sched))
            elif time.monotonic() - last_line >= 5:
                last_line = time.monotonic()
                console.print(
                    f"[{obs.elapsed():5.1f}s] registered {len(obs.registered)}/{nodes}, "
                    f"heartbeats/s {obs.heartbeats_per_s():.1f}, events {obs.total}, "
                    f"jobs started {obs.jobs_started} exited {sum(obs.exits.values())}, "
                    f"links not up {len(obs.links_not_up())}, pool {pool.utilisation()}, "
                    f"fragmentation {pool.fragmentation()}"
                )
                if asked:
                    console.print(f"         scheduler: {sched.queue_lines()}; {sched.decision()}")
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.25)
            except TimeoutError:
                pass
        live.update(_view(obs, nodes, "stopping", pool, sched))
    gangs = await _read_gangs(http, by_name["scheduler"].url, by_name["fabric_monitor"].url) if asked else None
    if asked:  # the gang that must wait is cancelled, so the scheduler stops with nothing queued
        async with http.delete(f"{by_name['scheduler'].url}/v1/jobs/{NEVER_FITS_JOB}") as r:
            await r.read()
    ramp_stop.set()
    if ramp_task is not None:
        await ramp_task
    if cost is not None:
        await cost.end(bus, http, by_name["scheduler"].url)
    locked = await _refused_without_credentials(info, by_name["scheduler"].url) if info.secured else None
    listed = await _find_services(bus, services)
    slurm_seen = await asyncio.to_thread(_read_slurm, slurm) if slurm is not None else None
    # Stop the services while still watching, to see the agents deregister.
    for s in services:
        s.terminate()
    for _ in range(120):
        if not any(s.running() for s in services):
            break
        await asyncio.sleep(0.25)
    await asyncio.sleep(0.5)
    await http.close()
    await bus.close()
    await nc.drain()
    code = _summary(console, obs, args, pool, plan, services, submitted, gangs, locked, listed, slurm_seen)
    if cost is not None:
        measured = cost.measured(obs, args, plan, summary_ok=code == 0)
        await asyncio.to_thread(Path(args.measure).write_bytes, msgspec.json.format(msgspec.json.encode(measured)))
        console.print(f"costs written to {args.measure}")
    return code


class _Costs:
    """What the run costs (`--measure`, ibpool_cli.measure): processes sampled every second, the
    stores at the start of the steady part (every node heartbeating) and at the end."""

    def __init__(self, info: devstack.StackInfo, services: list[ServiceProcess]) -> None:
        self.info = info
        self.services = services
        self.meter = measure.ProcessMeter()
        self.last = 0.0
        self.steady_at: float | None = None
        self.ended_at = 0.0
        self.streams: tuple[dict[str, int], dict[str, int]] = ({}, {})
        self.postgres: tuple[dict[str, measure.StoreSize], dict[str, measure.StoreSize]] = ({}, {})
        self.metrics = ""

    def pids(self) -> dict[str, int]:
        out = {s.name: s.proc.pid for s in self.services if s.proc is not None and s.running()}
        return out | {"nats-server": self.info.nats_pid, "postgres": self.info.postgres_pid}

    async def tick(self, obs: Observed, bus: Bus) -> None:
        if time.monotonic() - self.last < 1.0:
            return
        self.last = time.monotonic()
        if self.steady_at is None and obs.all_heartbeating_after is not None:
            self.steady_at = obs.elapsed()
            self.meter.steady_starts(self.pids())
            self.streams = (await measure.stream_bytes(bus.js), {})
            self.postgres = (await measure.postgres_sizes(self.info.postgres_dsn), {})
        else:
            self.meter.sample(self.pids())

    async def end(self, bus: Bus, http: aiohttp.ClientSession, scheduler_url: str) -> None:
        self.meter.sample(self.pids())
        self.ended_at = time.monotonic()
        self.streams = (self.streams[0], await measure.stream_bytes(bus.js))
        self.postgres = (self.postgres[0], await measure.postgres_sizes(self.info.postgres_dsn))
        try:
            async with http.get(f"{scheduler_url}/metrics") as r:
                self.metrics = await r.text()
        except (aiohttp.ClientError, TimeoutError):
            self.metrics = ""

    def measured(
        self, obs: Observed, args: argparse.Namespace, plan: FaultPlan | None, *, summary_ok: bool
    ) -> measure.Measured:
        duration = self.ended_at - obs.started
        steady = duration - (self.steady_at or 0.0)
        waits = [obs.scheduled_at[j] - t for j, t in obs.queued_at.items() if j in obs.scheduled_at]
        q50, q99 = measure.quantiles(waits)
        spare = f"node-{args.nodes + 1:03d}"
        killed = plan.killed_at if plan is not None else None
        failed = obs.failed.get(spare)
        empty = measure.StoreSize(rows=0, bytes=0)
        return measure.Measured(
            nodes=args.nodes + 1,
            gpus=8 * (args.nodes + 1),
            duration_s=round(duration, 1),
            steady_s=round(steady, 1),
            processes=self.meter.costs(),
            events_per_s={k: round(v / duration, 2) for k, v in sorted(obs.by_type.items())},
            stream_bytes={k: (self.streams[0].get(k, 0), v) for k, v in self.streams[1].items()},
            postgres={k: (self.postgres[0].get(k, empty), v) for k, v in self.postgres[1].items()},
            cycle_p50_s=measure.histogram_quantile(self.metrics, "ibpool_scheduler_cycle_seconds", 0.5),
            cycle_p99_s=measure.histogram_quantile(self.metrics, "ibpool_scheduler_cycle_seconds", 0.99),
            queued_to_scheduled_p50_s=q50,
            queued_to_scheduled_p99_s=q99,
            kill_to_failed_s=round(failed - killed, 2) if failed is not None and killed is not None else None,
            summary_ok=summary_ok,
        )


def _slurm_checks(
    obs: Observed, args: argparse.Namespace, plan: FaultPlan | None, slurm: SlurmSeen
) -> list[tuple[str, str, bool]]:
    """--slurm: the fabric became Slurm's topology, and the spare was drained and resumed in Slurm."""
    hosts = [f"{NODE_PREFIX}-{i:03d}" for i in range(1, args.nodes + 1)]
    spare = f"{NODE_PREFIX}-{args.nodes + 1:03d}"
    checks = [
        (
            "Slurm: the published fabric is its topology.conf (the Slurm bridge), each fabric host under one leaf",
            slurm.error or f"{len(slurm.leaf_nodes)} of {len(hosts)} hosts under {slurm.leaves} leaf switches",
            sorted(slurm.leaf_nodes) == hosts and "boot" not in slurm.switches,
        )
    ]
    if plan is not None and plan.killed_at is not None:
        drained, resumed = obs.slurm_drained.get(spare), obs.slurm_resumed.get(spare)
        checks += [
            (
                f"Slurm: {spare} drained by ibpool after its agent's SIGKILL (Slurm's own SlurmdTimeout: 300 s)",
                "-" if drained is None else f"after {drained - plan.killed_at:.1f} s",
                drained is not None and drained >= plan.killed_at,
            ),
            (
                f"Slurm: {spare} resumed by ibpool after it recovered",
                "-" if resumed is None or plan.restarted_at is None else f"after {resumed - plan.restarted_at:.1f} s",
                resumed is not None,
            ),
            (
                "Slurm: no other node drained by ibpool",
                ", ".join(sorted(set(obs.slurm_drained) - {spare})) or "none",
                set(obs.slurm_drained) <= {spare},
            ),
        ]
    return checks


async def _refused_without_credentials(info: devstack.StackInfo, scheduler_url: str) -> dict[str, bool]:
    """Whether a secured stack turns away who has no credentials: an anonymous NATS client, a POST
    without a token (the scheduler's API; the services all check the same file), and a Postgres
    connection without the password. Tried against the live stack."""
    refused: dict[str, bool] = {}
    try:
        anonymous = await nats.connect(info.nats_url, name="anonymous", allow_reconnect=False, connect_timeout=2)
    except Exception:  # nats.py raises the server's authorization error, or gives up connecting
        refused["nats"] = True
    else:
        refused["nats"] = False
        await anonymous.close()
    try:
        async with (
            aiohttp.ClientSession() as anon,
            anon.post(f"{scheduler_url}/v1/jobs", json={"tenant": "anonymous", "gpus": 1}) as r,
        ):
            refused["api"] = r.status == 401
    except aiohttp.ClientError:
        refused["api"] = False
    import asyncpg

    try:
        conn = await asyncpg.connect(
            info.postgres_dsn.replace(f":{devstack.postgres_password(info)}@", "@", 1), timeout=5
        )
    except (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError):
        refused["postgres"] = True
    except Exception:
        refused["postgres"] = False
    else:
        refused["postgres"] = False
        await conn.close()
    return refused


@dataclass
class SlurmSeen:
    """--slurm: Slurm's topology at the end of the run, as slurmctld shows it."""

    switches: list[str]
    leaves: int  # switches of level 0
    leaf_nodes: list[str]  # the nodes under leaf switches, as Slurm expands them (duplicates kept)
    error: str = ""


def _read_slurm(slurm: slurmstack.Cluster) -> SlurmSeen:
    try:
        shown = slurm.scontrol("show", "topology")
        switches = [
            f.split("=", 1)[1] for line in shown.splitlines() for f in line.split() if f.startswith("SwitchName=")
        ]
        leaves = [
            f.split("=", 1)[1]
            for line in shown.splitlines()
            if " Level=0 " in line
            for f in line.split()
            if f.startswith("Nodes=")
        ]
        nodes = slurm.scontrol("show", "hostnames", ",".join(leaves)).split() if leaves else []
        return SlurmSeen(switches=switches, leaves=len(leaves), leaf_nodes=nodes)
    except slurmstack.SlurmError as e:
        return SlurmSeen(switches=[], leaves=0, leaf_nodes=[], error=str(e))


def _summary(
    console: Console,
    obs: Observed,
    args: argparse.Namespace,
    pool: PoolSeen,
    plan: FaultPlan | None,
    services: list[ServiceProcess],
    submitted: int = 0,
    gangs: GangsSeen | None = None,
    locked: dict[str, bool] | None = None,
    listed: list[ServiceView] | None = None,
    slurm: SlurmSeen | None = None,
) -> int:
    t = Table(title="ibpool run: summary")
    t.add_column("check")
    t.add_column("seen", justify="right")
    t.add_column("ok")
    first = obs.all_heartbeating_after
    hb = obs.by_type.get(NodeHeartbeat.ce_type(), 0)
    topo = obs.topology
    su = su_size_for(args.nodes)
    should_complete = {str(j["id"]) for j in _scheduler_jobs(0)} - {NEVER_FITS_JOB}
    completed = sum(1 for j in should_complete if obs.jobs_finished.get(j) == "completed")
    checks = [
        ("nodes registered", f"{len(obs.registered)}/{args.nodes + 1}", len(obs.registered) == args.nodes + 1),
        (
            f"all nodes heartbeating within {HEARTBEAT_DEADLINE_S:.0f} s",
            "-" if first is None else f"{first:.2f} s",
            first is not None and first <= HEARTBEAT_DEADLINE_S,
        ),
        ("heartbeats seen", str(hb), hb > 0),
    ]
    # The demonstration's checks (its allocations, jobs, faults): under --serve they depend on how
    # long the system was served before Ctrl-C, so they are shown there, not judged.
    scenario_from = len(checks)
    checks += [
        (
            "allocations granted by the pool allocator (whole, fraction, MIG, gang, remote)",
            f"{pool.granted} of {len(_allocation_asks(0))}"
            + (f", rejected {dict(pool.rejected)}" if pool.rejected else ""),
            pool.granted == len(_allocation_asks(0)),
        ),
        (
            "gang of 2 hosts under one leaf group of the fabric",
            "-" if pool.gang_leaf_groups is None else f"{pool.gang_leaf_groups} leaf group(s)",
            pool.gang_leaf_groups == 1,
        ),
        (
            "remote grant within max_remote_hops (4), with its distance",
            "-" if pool.remote is None else f"client {pool.remote[0]}, {pool.remote[1]} hops",
            pool.remote is not None and pool.remote[1] is not None and 0 < pool.remote[1] <= 4,
        ),
        (
            "pool fragmentation measured for the learned mix",
            pool.fragmentation() if pool.fragmentation_measure else "-",
            pool.fragmentation_measure == "fgd",
        ),
        ("jobs started on the node agents", str(obs.jobs_started), obs.jobs_started >= pool.granted > 0),
        (
            "inference deployment scaled up with the load and back down",
            " -> ".join(map(str, obs.replica_targets)) or "-",
            bool(obs.replica_targets)
            and max(obs.replica_targets) >= 3
            and obs.replica_targets[-1] < max(obs.replica_targets),
        ),
        (
            "elastic training job grown into idle GPUs",
            " -> ".join(map(str, obs.elastic_sizes)) or "-",
            bool(obs.elastic_sizes) and max(obs.elastic_sizes) > DEMO_ELASTIC_JOB["min_workers"],  # type: ignore[operator]
        ),
        (
            "jobs submitted to the scheduler (gangs, small jobs, inference slices) completed, all but the waiting one",
            f"{completed} of {len(should_complete)}",
            submitted == len(_scheduler_jobs(0)) and completed == len(should_complete),
        ),
        (
            "every multi-node placement within its required tier of the published fabric",
            "-" if gangs is None else f"{gangs.placed} placed: {gangs.tiers_line()}",
            gangs is not None and gangs.placed >= 2 and not gangs.violations,
        ),
        (
            f"{NEVER_FITS_JOB} ({su + 1} hosts, required under one leaf group of {su}) waits, saying the tier",
            "-" if gangs is None or gangs.waiting is None else f"{gangs.waiting[0]}: {gangs.waiting[1]}",
            gangs is not None
            and gangs.waiting is not None
            and gangs.waiting[0] == "queued"
            and "leaf group (tier 1)" in gangs.waiting[1],
        ),
        (
            "placements with SHARP hold SHARP trees and carry NCCL's settings",
            "-"
            if gangs is None
            else f"{gangs.sharp} with SHARP" + "".join(f", {j} without" for j in gangs.sharp_without_trees),
            gangs is not None and gangs.sharp >= 1 and not gangs.sharp_without_trees,
        ),
        (
            "jobs exited by reason (an OOM over its slice, one released while running)",
            ", ".join(f"{k} {v}" for k, v in sorted(obs.exits.items())) or "-",
            obs.exits.get("oom", 0) >= 1 and obs.exits.get("revoked", 0) >= 1,
        ),
        (
            "fabric topology published",
            "-" if topo is None else f"v{topo.version}, {topo.hosts} hosts, {topo.switches} switches",
            topo is not None and topo.hosts == args.nodes,
        ),
    ]
    if plan is not None and plan.injected:
        faulty = {str(f["link_id"]) for f in plan.faults}
        checks += [
            (
                "injected link faults detected (down, error rate)",
                f"went down {obs.link_downs}, degraded "
                + (", ".join(f"{problem} {n}" for problem, n in sorted(obs.degraded.items())) or "-"),
                obs.degraded.get("errors", 0) > 0 and obs.link_downs > 0,
            ),
            (
                "faulty links recovered after clearing",
                f"{len(faulty & obs.recovered)}/{len(faulty)}",
                not plan.cleared or faulty <= obs.recovered,
            ),
        ]
    if plan is not None and plan.killed_at is not None:
        spare = f"node-{args.nodes + 1:03d}"
        failed_at, back_at = obs.failed.get(spare), obs.recovered_nodes.get(spare)
        checks += [
            (
                f"{spare}'s agent SIGKILLed: failed by the failover controller",
                "-" if failed_at is None else f"after {failed_at - plan.killed_at:.1f} s",
                failed_at is not None and failed_at >= plan.killed_at,
            ),
            (
                f"{spare} recovered after its agent restarted (stable window 3 s)",
                "-" if back_at is None or plan.restarted_at is None else f"after {back_at - plan.restarted_at:.1f} s",
                back_at is not None and plan.restarted_at is not None and back_at >= plan.restarted_at,
            ),
            (
                "no other node failed",
                ", ".join(sorted(set(obs.failed) - {spare})) or "none",
                set(obs.failed) <= {spare},
            ),
        ]
    if slurm is not None:
        checks += _slurm_checks(obs, args, plan, slurm)
    scenario = range(scenario_from, len(checks)) if args.serve else range(0)
    nodes = args.nodes + 1
    checks += [
        ("nodes deregistered at stop", f"{len(obs.deregistered)}/{nodes}", len(obs.deregistered) == nodes),
        ("undecodable messages", str(obs.undecodable), obs.undecodable == 0),
        (
            "grants, revocations, releases, expiries signed by the allocator (agents verify them)",
            f"{obs.signed} signed, {obs.unsigned} not",
            obs.signed > 0 and obs.unsigned == 0,
        ),
    ]
    if locked is not None:
        checks.append(
            (
                "without credentials: NATS, the APIs and Postgres refuse (the services each on their own user)",
                ", ".join(f"{k} {'refused' if v else 'LET IN'}" for k, v in locked.items()),
                all(locked.values()),
            )
        )
    else:
        checks.append(("stack locked (users, tokens, passwords)", "no: --insecure", True))
    answered = {v.http_url: v for v in listed or []}
    missing = [s.name for s in services if s.url not in answered]
    leaders = sorted(v.service for v in answered.values() if v.role == "leader")
    checks.append(
        (
            "every service process found from the bus (NATS service API, `ibpool services`)",
            f"{len(services) - len(missing)} of {len(services)}; leaders: {', '.join(leaders) or '-'}"
            + (f"; missing {', '.join(missing)}" if missing else ""),
            not missing,
        )
    )
    for s in services:
        rc = s.proc.returncode if s.proc is not None else None
        checks.append((f"{s.name} exit code", str(rc), rc == 0))
    console.print()
    ok_all = True
    for i, (name, seen, ok) in enumerate(checks):
        if i in scenario:
            t.add_row(name, seen, "[dim]shown[/]" if not ok else "[green]yes[/]")
            continue
        t.add_row(name, seen, "[green]yes[/]" if ok else "[red]NO[/]")
        ok_all &= ok
    console.print(t)
    if scenario:
        console.print("(--serve: the demonstration's checks depend on how long it was served; shown, not judged)")
    return 0 if ok_all else 1
