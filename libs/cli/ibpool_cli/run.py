"""`ibpool run`: the main job.

Starts the embedded stack and the services that exist, a simulated cluster of node agents,
watches every event on the bus, and shows it live. The finite scenario (default) ends on its
own with a summary and exit code 0 when everything held; `--serve` keeps it up until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats
from nats.aio.msg import Msg
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from ibpool_proto import decode, new_id
from ibpool_proto.job import JobExited, JobStarted
from ibpool_proto.message import every_subject
from ibpool_proto.node import NodeDeregistered, NodeHeartbeat, NodeRegistered
from ibpool_proto.pool import AllocationGranted, AllocationRevoked, Enforcement, GpuAssignment, WorkloadSpec
from ibpool_runtime import devstack
from ibpool_runtime.bus import Bus

HEARTBEAT_DEADLINE_S = 10.0
SOURCE = "ibpool-run"


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
    total: int = 0
    undecodable: int = 0

    def heartbeats_per_s(self, window: float = 5.0) -> float:
        now = time.monotonic()
        return sum(1 for t in self.heartbeat_times if now - t <= window) / window

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def _observe(obs: Observed, expected_nodes: int) -> object:
    async def on_msg(msg: Msg) -> None:
        obs.total += 1
        ce_type = (msg.headers or {}).get("ce-type", "?")
        obs.by_type[ce_type] += 1
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
                now = time.monotonic()
                obs.heartbeating[ev.node_id] = now
                obs.heartbeat_times.append(now)
                if obs.all_heartbeating_after is None and len(obs.heartbeating) >= expected_nodes:
                    obs.all_heartbeating_after = obs.elapsed()
            case JobStarted():
                obs.jobs_started += 1
            case JobExited():
                obs.exits[ev.reason] += 1
            case _:
                pass

    return on_msg


def _view(obs: Observed, nodes: int, phase: str) -> Group:
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
    types = Table(title="events by type", show_edge=False)
    types.add_column("ce-type")
    types.add_column("count", justify="right")
    for t, n in sorted(obs.by_type.items()):
        types.add_row(t, str(n))
    return Group(head, types)


def _probe_grants(node_ids: list[str], seed: int) -> list[AllocationGranted]:
    """Grants the driver sends itself until the pool allocator lands: exercise start, exit, OOM."""
    rng = random.Random(seed)
    grants = []
    now = dt.datetime.now(dt.UTC)
    for i in range(8):
        node = rng.choice(node_ids)
        gpus = sorted(rng.sample(range(8), rng.choice([1, 2, 4])))
        oom = i == 5
        limit = 20_000 if oom else None
        grants.append(
            AllocationGranted(
                source=SOURCE,
                key=node,
                allocation_id=f"probe-{new_id()}",
                job_id=f"probe-job-{i}",
                node_id=node,
                kind="whole",
                assignments=[GpuAssignment(node_id=node, gpu_index=g) for g in gpus],
                enforcement=Enforcement(env={"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}, memory_limit_mib=limit),
                lease_expires_at=now + dt.timedelta(minutes=10),
                ledger_version=0,
                workload=WorkloadSpec(
                    simulated_runtime_s=rng.uniform(5, 15), simulated_memory_mib=30_000 if oom else 10_000
                ),
            )
        )
    return grants


def run_main(args: argparse.Namespace) -> int:
    console = Console()
    state = Path(args.state_dir or f".ibpool/run-{time.strftime('%Y%m%d-%H%M%S')}")
    console.print(f"[bold]ibpool run[/]: {args.nodes} simulated nodes, state in {state}")
    t0 = time.monotonic()
    try:
        info = devstack.up(state)
    except devstack.StackError as e:
        console.print(f"[red]embedded stack failed:[/] {e}")
        return 1
    console.print(f"stack up in {time.monotonic() - t0:.1f} s: nats {info.nats_url}, postgres {info.postgres_dsn}")
    agent_port = devstack.free_port()
    env = dict(
        os.environ,
        IBPOOL_NATS_URL=info.nats_url,
        IBPOOL_POSTGRES_DSN=info.postgres_dsn,
        IBPOOL_NODE_AGENT_HTTP_PORT=str(agent_port),
        IBPOOL_NODE_AGENT_BACKEND="simulated",
        IBPOOL_NODE_AGENT_INSTANCE="run",
    )
    agent_log = (state / "node_agent.log").open("ab")
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ibpool_node_agent",
            "--nodes",
            str(args.nodes),
            "--seed",
            str(args.seed),
            "--prefix",
            "node",
        ],
        env=env,
        stdout=agent_log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    code = 1
    try:
        code = asyncio.run(_scenario(args, info, agent, agent_port, console))
    except KeyboardInterrupt:
        code = 0
    finally:
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                agent.kill()
                console.print("[red]node agent did not stop within 30 s; killed[/]")
                code = 1
        agent_log.close()
        if agent.returncode not in (0, None):
            console.print(f"[red]node agent exited with {agent.returncode}; see {state / 'node_agent.log'}[/]")
            code = 1
        devstack.down(state)
        console.print("stack stopped")
    return code


async def _scenario(
    args: argparse.Namespace,
    info: devstack.StackInfo,
    agent: subprocess.Popen[bytes],
    agent_port: int,
    console: Console,
) -> int:
    obs = Observed()
    nc = await nats.connect(info.nats_url, name="ibpool-run")
    await nc.subscribe(every_subject(), cb=_observe(obs, args.nodes))  # type: ignore[arg-type]
    bus = await Bus.connect(info.nats_url, name="ibpool-run")
    await bus.ensure_streams()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    node_ids = [f"node-{i:03d}" for i in range(1, args.nodes + 1)]
    probes = _probe_grants(node_ids, args.seed)
    probes_sent = False
    revoked_sent = False
    served_printed = False
    interactive = console.is_terminal
    last_line = 0.0
    deadline = None if args.serve else time.monotonic() + args.duration
    with Live(
        _view(obs, args.nodes, "starting"),
        console=console,
        refresh_per_second=4,
        transient=False,
        auto_refresh=interactive,
    ) as live:
        while not stop.is_set():
            if agent.poll() is not None:
                console.print(f"[red]node agent exited early with {agent.returncode}[/]")
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            phase = "serving (Ctrl-C to stop)" if args.serve else "scenario"
            if not probes_sent and obs.all_heartbeating_after is not None:
                for g in probes:
                    await bus.publish(g)
                probes_sent = True
            if probes_sent and not revoked_sent and obs.jobs_started >= len(probes):
                g = probes[0]
                await bus.publish(
                    AllocationRevoked(
                        source=SOURCE,
                        key=g.node_id,
                        allocation_id=g.allocation_id,
                        job_id=g.job_id,
                        node_id=g.node_id,
                        ledger_version=0,
                        reason="probe: revoke one grant",
                    )
                )
                revoked_sent = True
            if args.serve and not served_printed and obs.all_heartbeating_after is not None:
                console.print(f"node agent API  http://127.0.0.1:{agent_port}/v1/nodes  (/healthz /readyz /metrics)")
                console.print(f"nats            {info.nats_url}  monitor {info.nats_monitor_url}")
                console.print(f"postgres        {info.postgres_dsn}")
                served_printed = True
            if interactive:
                live.update(_view(obs, args.nodes, phase))
            elif time.monotonic() - last_line >= 5:
                last_line = time.monotonic()
                console.print(
                    f"[{obs.elapsed():5.1f}s] registered {len(obs.registered)}/{args.nodes}, "
                    f"heartbeats/s {obs.heartbeats_per_s():.1f}, events {obs.total}, "
                    f"jobs started {obs.jobs_started} exited {sum(obs.exits.values())}"
                )
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.25)
            except TimeoutError:
                pass
        live.update(_view(obs, args.nodes, "stopping"))
    # Stop the agents while still watching, to see them deregister.
    if agent.poll() is None:
        agent.send_signal(signal.SIGTERM)
        for _ in range(120):
            if agent.poll() is not None:
                break
            await asyncio.sleep(0.25)
    await asyncio.sleep(0.5)
    await bus.close()
    await nc.drain()
    return _summary(console, obs, args, probes_sent, agent.returncode)


def _summary(
    console: Console, obs: Observed, args: argparse.Namespace, probes_sent: bool, agent_code: int | None
) -> int:
    t = Table(title="ibpool run: summary")
    t.add_column("check")
    t.add_column("seen", justify="right")
    t.add_column("ok")
    first = obs.all_heartbeating_after
    hb_ok = first is not None and first <= HEARTBEAT_DEADLINE_S
    checks = [
        ("nodes registered", f"{len(obs.registered)}/{args.nodes}", len(obs.registered) == args.nodes),
        (
            f"all nodes heartbeating within {HEARTBEAT_DEADLINE_S:.0f} s",
            "-" if first is None else f"{first:.2f} s",
            hb_ok,
        ),
        (
            "heartbeats seen",
            str(obs.by_type.get(NodeHeartbeat.ce_type(), 0)),
            obs.by_type.get(NodeHeartbeat.ce_type(), 0) > 0,
        ),
        (
            "probe jobs started (no allocator yet: grants sent by the driver)",
            str(obs.jobs_started),
            (not probes_sent) or obs.jobs_started > 0,
        ),
        ("jobs exited by reason", ", ".join(f"{k} {v}" for k, v in sorted(obs.exits.items())) or "-", True),
        ("nodes deregistered at stop", f"{len(obs.deregistered)}/{args.nodes}", len(obs.deregistered) == args.nodes),
        ("undecodable messages", str(obs.undecodable), obs.undecodable == 0),
        ("node agent exit code", str(agent_code), agent_code == 0),
    ]
    console.print()
    ok_all = True
    for name, seen, ok in checks:
        t.add_row(name, seen, "[green]yes[/]" if ok else "[red]NO[/]")
        ok_all &= ok
    console.print(t)
    return 0 if ok_all else 1
