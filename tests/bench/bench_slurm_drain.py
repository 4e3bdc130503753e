"""Slurm beside ibpool: from a node agent's SIGKILL to the Slurm node showing DRAIN.

Every part is real and runs as its own process: the embedded stack (nats-server, Postgres), the
failover controller (liveness through nats-server's disconnect advisories, its default here), the
Slurm bridge, AGENTS node agents of one simulated node each, and a throw-away Slurm (Debian's
munged, slurmctld and a slurmd per node, `ibpool_runtime.slurmstack`; needs root). Each round
SIGKILLs one agent and polls `scontrol show node` every 20 ms until Slurm shows the node drained
with ibpool's reason; then the agent is started again and the round waits until the failover
controller calls it healthy and Slurm shows it resumed.

Detection runs at its defaults (agent heartbeat 1 s, reconnect grace 1 s, the bridge's round at once
on a cordon); only recovery is shortened (stable window 1 s, flap memory 1 s), as in
bench_failover.py. `--slurm-own` times Slurm alone instead, once: a slurmd SIGKILLed, until
slurmctld shows the node not responding and DOWN, at its default `SlurmdTimeout` of 300 s
(results: bench_slurm_drain-slurm-own-latest.json).

Results: tests/bench/results/bench_slurm_drain-latest.json
Usage: .venv/bin/python tests/bench/bench_slurm_drain.py --rounds 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from bench_failover import failover_controller, until
from bench_pool import pct

from ibpool_cli.run import ServiceProcess
from ibpool_core.slurm_bridge import parse_scontrol_nodes
from ibpool_runtime import devstack, slurmstack

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ROUND_TIMEOUT_S = 60.0
SLURMD_TIMEOUT_DEFAULT_S = 300.0


async def _rounds(
    info: devstack.StackInfo, state: Path, slurm: slurmstack.Cluster, nodes: list[str], rounds: int
) -> dict[str, Any]:
    base = dict(os.environ, IBPOOL_NATS_URL=info.nats_url, IBPOOL_POSTGRES_DSN=info.postgres_dsn)
    core = [
        failover_controller(base, state, info.system_nats_url),
        ServiceProcess.of("slurm_bridge", base, state, instance="bench", SLURM_CONF=str(slurm.conf)),
    ]
    agents = {
        node: ServiceProcess.of(
            "node_agent",
            base,
            state,
            name=node,
            instance=f"a{i}",
            args=("--nodes", "1", "--first", str(i), "--prefix", "bench"),
            BACKEND="simulated",
        )
        for i, node in enumerate(nodes, 1)
    }
    for s in [*core, *agents.values()]:
        s.start()
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
    failover = core[0].url
    latencies: list[float] = []
    reasons: list[str] = []

    async def slurm_nodes() -> dict[str, Any]:
        return parse_scontrol_nodes(await asyncio.to_thread(slurm.scontrol, "show", "node", "--details", "--oneliner"))

    async def healthy(node: str) -> bool:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with http.get(f"{failover}/health/nodes/{node}") as r:
                return r.status == 200 and (await r.json())["status"] == "healthy"
        return False

    async def ready() -> bool:
        shown = await slurm_nodes()
        return (
            all([await s.ready(http) for s in core])
            and all([await healthy(n) for n in nodes])
            and not any(shown[n].drained for n in nodes)
        )

    try:
        await until(ready, 90, "every service ready, every node healthy and no Slurm node drained")
        for i in range(rounds):
            victim = nodes[i % len(nodes)]
            killed = time.monotonic()
            agents[victim].kill()

            async def drained(victim: str = victim) -> str | None:
                node = (await slurm_nodes())[victim]
                return node.reason if node.drained else None

            reasons.append(await until(drained, ROUND_TIMEOUT_S, f"{victim} drained in Slurm", every_s=0.02))
            latencies.append(time.monotonic() - killed)
            print(
                f"round {i + 1:2d}: {victim} killed, drained in Slurm after {latencies[-1]:.2f} s: {reasons[-1]}",
                flush=True,
            )
            agents[victim].start()

            async def back(victim: str = victim) -> bool:
                return await healthy(victim) and not (await slurm_nodes())[victim].drained

            await until(back, ROUND_TIMEOUT_S, f"{victim} healthy and resumed in Slurm")
    finally:
        await http.close()
        for s in [*core, *agents.values()]:
            s.terminate()
        for s in [*core, *agents.values()]:
            s.wait()
    ordered = sorted(latencies)
    return {
        "rounds": len(latencies),
        "agents": len(nodes),
        "kill_to_slurm_drain_s": {
            "p50": round(pct(ordered, 50), 3),
            "p99": round(pct(ordered, 99), 3),
            "max": round(ordered[-1], 3),
            "mean": round(statistics.fmean(ordered), 3),
            "all": [round(x, 3) for x in latencies],
        },
        "slurm_reasons": sorted(set(reasons)),
        "slurmd_timeout_default_s": SLURMD_TIMEOUT_DEFAULT_S,
    }


def slurm_own_detection(nodes: list[str]) -> dict[str, Any]:
    """Slurm alone, as the comparison: one node's slurmd SIGKILLed, timed until slurmctld shows the
    node not responding (`*`) and DOWN, at Slurm's defaults (SlurmdTimeout 300 s)."""
    state = Path(tempfile.mkdtemp(prefix="ibpool-bench-slurm-own-"))
    try:
        with (
            slurmstack.munge(state / "munge") as socket_path,
            slurmstack.cluster(state / "slurm", socket_path, nodes, slurmd=nodes) as slurm,
        ):
            victim = nodes[0]

            def shown() -> str:
                line = slurm.scontrol("show", "node", victim, "--oneliner")
                return next(f for f in line.split() if f.startswith("State=")).removeprefix("State=")

            deadline = time.monotonic() + 60
            while "IDLE" not in shown() and time.monotonic() < deadline:
                time.sleep(0.2)
            killed = time.monotonic()
            slurm.kill_slurmd(victim)
            not_responding = down = None
            while down is None and time.monotonic() - killed < 900:
                now = shown()
                if not_responding is None and ("NOT_RESPONDING" in now or "*" in now):
                    not_responding = time.monotonic() - killed
                if "DOWN" in now:
                    down = time.monotonic() - killed
                time.sleep(1.0)
            print(
                f"Slurm alone: {victim}'s slurmd SIGKILLed: not responding after {not_responding} s, "
                f"DOWN after {down} s"
            )
            return {"slurmd_kill_to_not_responding_s": not_responding, "slurmd_kill_to_down_s": down}
    finally:
        shutil.rmtree(state, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--agents", type=int, default=4)
    p.add_argument(
        "--slurm-own",
        action="store_true",
        help="instead: Slurm alone, one slurmd SIGKILLed, timed until Slurm marks the node down (minutes)",
    )
    args = p.parse_args()
    if args.slurm_own:
        own = slurm_own_detection([f"bench-{i:03d}" for i in range(1, args.agents + 1)])
        own |= {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "slurm": "Debian slurmctld/slurmd 22.05"}
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "bench_slurm_drain-slurm-own-latest.json").write_text(json.dumps(own, indent=2) + "\n")
        return 0
    nodes = [f"bench-{i:03d}" for i in range(1, args.agents + 1)]
    state = Path(tempfile.mkdtemp(prefix="ibpool-bench-slurm-"))
    info = devstack.up(state, sync_always=True)
    try:
        with (
            slurmstack.munge(state / "munge") as socket_path,
            slurmstack.cluster(state / "slurm", socket_path, nodes, slurmd=nodes) as slurm,
        ):
            result = asyncio.run(_rounds(info, state, slurm, nodes, args.rounds))
    finally:
        devstack.down(state)
        shutil.rmtree(state, ignore_errors=True)
    result |= {
        "slurm": "Debian slurmctld/slurmd 22.05, one host, a slurmd per node in its own UTS namespace",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_1m": os.getloadavg()[0]},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_slurm_drain-latest.json").write_text(json.dumps(result, indent=2) + "\n")
    k = result["kill_to_slurm_drain_s"]
    print(
        f"SIGKILL -> Slurm DRAIN over {result['rounds']} rounds: p50 {k['p50']} s, p99 {k['p99']} s, "
        f"max {k['max']} s (Slurm's own SlurmdTimeout default: {SLURMD_TIMEOUT_DEFAULT_S:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
