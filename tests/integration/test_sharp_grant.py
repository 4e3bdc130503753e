"""SHARP and rank order end to end, against real NATS and Postgres, with the scheduler, the pool allocator
and one node agent per node in-process: a gang lands under the SHARP-capable leaf without asking, its
job says SHARP is on, and NCCL's CollNet/SHARP settings and the rank variables reach the processes it
runs; on nodes with no SHARP label the job says why not, and the hosts' rank order (leaf by leaf,
not by name) is what the grants, the job and every member's environment show."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from ibpool_proto.job import JobScheduled
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.service import Service
from ibpool_runtime.store import Store
from tests.integration.agent_support import running_agent, unique_prefix
from tests.integration.helpers import eventually, own_store
from tests.integration.test_scheduler import (
    call,
    job_events,
    job_id,
    job_state,
    pool_stream_next,
    running_allocator,
    running_scheduler,
    until_leading,
)

LEAF, SHARP = "ibpool.io/leaf", "ibpool.io/sharp"
# Writes the environment it was started with to env.json in its working directory (one per member).
DUMP_ENV = [sys.executable, "-c", "import json, os; json.dump(dict(os.environ), open('env.json', 'w'))"]


@asynccontextmanager
async def labelled_cluster(
    bus: Bus, store: Store, stack: StackInfo, labels: list[dict[str, str]], **agent: Any
) -> AsyncIterator[tuple[Service[Any], list[str], list[Service[Any]]]]:
    """One agent per node, node i announced with `labels[i]`; the allocator and a leading scheduler."""
    prefix = unique_prefix()
    node_ids = [f"{prefix}-{i:03d}" for i in range(1, len(labels) + 1)]
    async with AsyncExitStack() as stack_:
        from_seq = await pool_stream_next(bus)
        agents = []
        for i, node_labels in enumerate(labels, start=1):
            agent_store = await stack_.enter_async_context(own_store(stack))
            settings = {k: v(i) if callable(v) else v for k, v in agent.items()}
            agents.append(
                await stack_.enter_async_context(
                    running_agent(
                        bus, agent_store, nodes=1, node_prefix=prefix, first_node=i, labels=node_labels, **settings
                    )
                )
            )
        await stack_.enter_async_context(running_allocator(bus, await stack_.enter_async_context(own_store(stack))))
        service, sched = await stack_.enter_async_context(
            running_scheduler(bus, store, from_seq, leader_key=f"sched-{prefix}")
        )
        await until_leading(sched, node_ids)

        async def labelled() -> bool:
            nodes = sched.feed.ledger.nodes
            return all(
                nodes[n].labels.get(k) == v for n, ls in zip(node_ids, labels, strict=True) for k, v in ls.items()
            )

        await eventually(labelled, what="every node's labels in the scheduler's ledger replica")
        yield service, node_ids, agents


async def test_a_gang_under_a_sharp_leaf_runs_with_sharp_and_its_members_get_nccl_and_rank_env(
    bus: Bus, store: Store, stack: StackInfo, tmp_path: Path
) -> None:
    # leaf a (nodes 1, 2) plain, leaf b (nodes 3, 4) SHARP-capable: name order alone would pick leaf a
    labels = [{LEAF: "a"}, {LEAF: "a"}, {LEAF: "b", SHARP: "true"}, {LEAF: "b", SHARP: "true"}]
    work = {i: tmp_path / f"agent{i}" for i in range(1, 5)}
    async with labelled_cluster(
        bus, store, stack, labels, allow_commands=True, work_dir=lambda i: str(work[i]), stop_grace_s=2
    ) as (service, node_ids, _agents):
        j = job_id()
        body = {"id": j, "tenant": "t", "hosts": 2, "gpus_per_host": 8, "workload": {"command": DUMP_ENV}}
        status, view = await call(service, "POST", "/v1/jobs", body)
        assert status == 201, view

        async def completed() -> bool:
            return (await job_state(service, j))["state"] == "completed"

        await eventually(completed, what="both members ran their command and the gang completed")
        done = await job_state(service, j)
        placement = done["placement"]
        assert placement["sharp"] is True, placement
        assert "SHARP-capable" in placement["sharp_reason"], placement
        assert placement["nccl_env"] == {"NCCL_COLLNET_ENABLE": "1", "SHARP_COLL_ENABLE_SAT": "1"}
        assert sorted(placement["ranks"]) == node_ids[2:] and done["nodes"] == placement["ranks"], done
        (scheduled,) = await job_events(bus, j, JobScheduled)
        assert scheduled.nodes == placement["ranks"]

        envs = {}
        for i in (3, 4):
            (dumped,) = list(work[i].glob("*/env.json"))
            envs[node_ids[i - 1]] = json.loads(dumped.read_text())
        assert not list(work[1].glob("*/env.json")) and not list(work[2].glob("*/env.json"))
        first = placement["ranks"][0]
        for rank, host in enumerate(placement["ranks"]):
            env = envs[host]
            assert env["NCCL_COLLNET_ENABLE"] == "1" and env["SHARP_COLL_ENABLE_SAT"] == "1", env
            assert (env["NODE_RANK"], env["IBPOOL_RANK"], env["NNODES"], env["IBPOOL_WORLD_SIZE"]) == (
                str(rank),
                str(rank),
                "2",
                "2",
            )
            assert env["MASTER_ADDR"] == first and env["IBPOOL_HOSTS"] == ",".join(placement["ranks"])
            assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 8 and env["IBPOOL_NODE_ID"] == host


async def test_without_sharp_leaves_the_job_says_why_and_ranks_hosts_leaf_by_leaf(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    # leaves interleaved by name: nodes 1 and 3 on leaf a, 2 and 4 on leaf b; no SHARP label anywhere
    labels = [{LEAF: "a"}, {LEAF: "b"}, {LEAF: "a"}, {LEAF: "b"}]
    async with labelled_cluster(bus, store, stack, labels) as (service, node_ids, agents):
        j = job_id()
        body = {"id": j, "tenant": "t", "hosts": 4, "gpus_per_host": 2, "workload": {"simulated_runtime_s": 120}}
        status, view = await call(service, "POST", "/v1/jobs", body)
        assert status == 201, view

        async def running() -> bool:
            return (await job_state(service, j))["state"] == "running"

        await eventually(running, what="the gang running")
        placement = (await job_state(service, j))["placement"]
        assert placement["sharp"] is False and placement["nccl_env"] == {}
        assert placement["sharp_reason"] == "the fabric has no SHARP-capable switch"
        n1, n2, n3, n4 = node_ids
        ranked = [n1, n3, n2, n4]  # leaf a's hosts, then leaf b's: the ring crosses between leaves twice
        assert placement["ranks"] == ranked, placement
        (scheduled,) = await job_events(bus, j, JobScheduled)
        assert scheduled.nodes == ranked

        # What the simulated launcher recorded for each member, as its agent's API shows it.
        for i, agent in enumerate(agents):
            node = node_ids[i]
            status, shown = await call(agent, "GET", f"/v1/nodes/{node}")
            assert status == 200, shown
            (work,) = [w for w in shown["running"] if w["job_id"] == j]
            env = work["env"]
            assert env["NODE_RANK"] == str(ranked.index(node)) and env["NNODES"] == "4", env
            assert env["MASTER_ADDR"] == n1 and env["IBPOOL_HOSTS"] == ",".join(ranked)
            assert "NCCL_COLLNET_ENABLE" not in env and len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 2
        status, _ = await call(service, "DELETE", f"/v1/jobs/{j}")
        assert status in (200, 202), status
