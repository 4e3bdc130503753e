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
bench_failover.py. Slurm's own detection of a dead node is its `SlurmdTimeout`, 300 s by default
(slurm.conf(5)), which this script does not wait out.

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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--agents", type=int, default=4)
    args = p.parse_args()
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
