"""The failover controller keeps its health picture entry by entry in Postgres, and writes only what
a decision changed: a cluster beating on time writes nothing, a restart reads back the same picture,
and a picture saved whole by an earlier version is rewritten entry by entry when read."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import re

import aiohttp
import msgspec

from ibpool_core.health.decide import (
    FailoverRequest,
    HealthState,
    NodeHealth,
    Observation,
    decide,
    restart_grace,
)
from ibpool_failover_controller import state as fc_state
from ibpool_failover_controller.bootstrap import bootstrap as controller_bootstrap
from ibpool_proto.job import JobFinished
from ibpool_proto.node import NodeHeartbeat
from ibpool_proto.pool import AllocationGranted, Enforcement, GpuAssignment
from ibpool_runtime.bus import Bus
from ibpool_runtime.store import Store
from tests.integration.agent_support import unique_prefix
from tests.integration.helpers import eventually
from tests.integration.test_failover_controller import (
    LENIENT,
    controller_kit,
    get_json,
    registration,
    running,
    sample,
)

T0 = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)


def untimed(state: HealthState) -> HealthState:
    """The picture without heartbeat and telemetry times (not kept: a restart gives a fresh window)."""

    def node(n: NodeHealth) -> NodeHealth:
        return msgspec.structs.replace(n, last_beat=None if n.last_beat is None else T0, telemetry_at=None)

    return msgspec.structs.replace(state, nodes={k: node(n) for k, n in state.nodes.items()})


def grant(node: str, job: str, gpu: int) -> AllocationGranted:
    return AllocationGranted(
        source="test",
        key=node,
        allocation_id=f"a-{job}",
        job_id=job,
        node_id=node,
        kind="whole",
        assignments=[GpuAssignment(node_id=node, gpu_index=gpu)],
        enforcement=Enforcement(),
        lease_expires_at=T0.replace(year=2100),
        ledger_version=1,
    )


def stamped(o: Observation, at: dt.datetime) -> Observation:
    return msgspec.structs.replace(o, occurred_at=at)


async def test_entries_written_by_decisions_read_back_as_the_same_picture(store: Store) -> None:
    await store.migrate(fc_state.MIGRATIONS)
    nodes = ["e0", "e1", "e2"]
    first: list[Observation] = [stamped(registration(n), T0) for n in nodes]
    first += [stamped(grant("e0", "j1", 1), T0), stamped(grant("e1", "j2", 0), T0)]
    state = HealthState()
    kept = HealthState()
    t = T0
    for batch in (
        first,
        [stamped(sample("e0", 1, [48]), T0 + dt.timedelta(seconds=1))],  # GPU 1 of e0 fails: j1 requeued
        [JobFinished(source="test", key="j2", job_id="j2", state="completed", occurred_at=T0)],
        [],  # nothing: the nodes go silent, suspected after the window
    ):
        t += dt.timedelta(seconds=2)
        reply = decide(FailoverRequest(state=state, now=t, observations=batch))
        state = reply.state
        async with store.transaction() as tx:
            await fc_state.save_changes(tx.conn, state, reply.changes, t)
        async with store.transaction() as tx:
            kept, whole = await fc_state.load_state(tx.conn)
        assert not whole
        assert untimed(kept) == untimed(state)
    assert kept.nodes["e0"].gpus[1].failed
    assert "j1" in kept.jobs and "j2" in kept.finished
    assert {n.status for n in kept.nodes.values()} == {"suspect"}


async def test_a_picture_saved_whole_before_is_rewritten_entry_by_entry_when_the_controller_takes_over(
    bus: Bus, store: Store
) -> None:
    node = f"{unique_prefix()}-w"
    old = decide(FailoverRequest(state=HealthState(), now=T0, observations=[stamped(registration(node), T0)])).state
    old = decide(
        FailoverRequest(state=old, now=T0, observations=[stamped(sample(node, 2, [48]), T0 + dt.timedelta(seconds=1))])
    ).state
    assert old.nodes[node].gpus[2].failed
    await store.migrate(fc_state.MIGRATIONS)
    async with store.transaction() as tx:  # as the controller saved it before health_entries
        await tx.conn.execute(
            "INSERT INTO health_state (id, body, updated_at) VALUES (1, $1, $2)",
            msgspec.json.encode(old).decode(),
            T0,
        )
    kit = controller_kit(bus, store, **LENIENT)
    async with running("failover_controller", kit, controller_bootstrap) as controller:

        async def known() -> bool:
            status, body = await get_json(f"{controller.http_url}/health/nodes/{node}")
            return status == 200 and [(g["index"], g["failed"]) for g in body["gpus"]] == [(2, True)]

        await eventually(known, what="the node and its failed GPU read from the picture saved whole")
    async with store.transaction() as tx:
        body = await tx.conn.fetchval("SELECT body FROM health_state WHERE id = 1")
        rows = await tx.conn.fetch("SELECT map, key FROM health_entries")
        kept, whole = await fc_state.load_state(tx.conn)
    assert not msgspec.json.decode(body)["nodes"]  # the body keeps no map any more
    assert ("nodes", node) in {(r["map"], r["key"]) for r in rows}
    assert not whole
    assert untimed(kept).nodes[node] == untimed(restart_grace(old, T0)).nodes[node]


async def written(url: str | None) -> float:
    assert url is not None
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as r:
        text = await r.text()
    found = re.search(r"^ibpool_failover_state_entries_written_total (\S+)$", text, re.M)
    assert found, "ibpool_failover_state_entries_written_total not exported"
    return float(found.group(1))


async def test_nodes_beating_on_time_make_the_controller_write_nothing(bus: Bus, store: Store) -> None:
    nodes = [f"{unique_prefix()}-q{i}" for i in range(20)]
    stop = asyncio.Event()

    async def beat() -> None:
        seq = 0
        while not stop.is_set():
            seq += 1
            for n in nodes:
                await bus.publish_unacked(NodeHeartbeat(source="test", key=n, node_id=n, seq=seq, interval_s=0.2))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    beating = asyncio.create_task(beat())
    try:
        kit = controller_kit(bus, store, **LENIENT)
        async with running("failover_controller", kit, controller_bootstrap) as controller:
            for n in nodes:
                await bus.publish(registration(n))

            async def all_known() -> bool:
                status, body = await get_json(f"{controller.http_url}/health/nodes")
                return status == 200 and set(nodes) <= {x["node_id"] for x in body}

            await eventually(all_known, what="every node registered")
            await asyncio.sleep(1.0)  # the registrations' entries are written
            before = await written(controller.http_url)
            assert before >= len(nodes)
            await asyncio.sleep(3.0)  # 30 ticks, 15 beats of every node
            assert await written(controller.http_url) == before
            await bus.publish(sample(nodes[0], 3, [48]))  # one node's GPU fails: that node's entry (and no other)

            async def one_more() -> bool:
                return await written(controller.http_url) > before

            await eventually(one_more, what="the failed GPU's node written")
            assert await written(controller.http_url) - before <= 2
    finally:
        stop.set()
        await beating
