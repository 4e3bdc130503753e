"""Grants that prove where they come from, on real NATS and Postgres: a node agent that trusts the
pool allocator's key runs only what the allocator signed, and never a replay or a grant for GPUs its
running work holds; everything else is dead-lettered with the reason and counted, never run.

And end to end: an allocator with a signing seed and an agent that trusts its public key run a
requested allocation, while the same grant forged by anyone else (unsigned, another key, changed
on the way) is refused."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec

from ibpool_node_agent import state as agent_state
from ibpool_proto import Message, new_id
from ibpool_proto.job import JobStarted
from ibpool_proto.pool import AllocationGranted, AllocationRevoked
from ibpool_runtime.bus import Bus, outgoing
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.grant_signing import GrantSigner, new_seed
from ibpool_runtime.service import Service
from ibpool_runtime.store import Store
from ibpool_runtime.streams import DLQ_STREAM
from tests.integration.agent_support import grant, running_agent
from tests.integration.helpers import eventually, job_news, own_store, stream_messages
from tests.integration.test_pool_allocator import propose, running_allocator

SEED = new_seed()
SIGNER = GrantSigner(SEED)


async def publish(bus: Bus, message: Message, signer: GrantSigner | None = SIGNER, tamper: bool = False) -> None:
    out = outgoing(message)
    if signer is not None:
        out = signer.sign(message, out)
    body = out.body.replace(b'"gpu_index":0', b'"gpu_index":7') if tamper else out.body
    await bus.js.publish(out.subject, body, headers=out.headers)


async def started(bus: Bus, job_id: str) -> bool:
    return bool(await job_news(bus.js, JobStarted, job_id))


async def refusals(bus: Bus, svc: Service) -> list[str]:
    durable = svc.consumers[0].sub.durable
    return [m.headers["ibpool-dlq-reason"] for m in await stream_messages(bus.js, DLQ_STREAM, f"ibpool.dlq.{durable}")]


@asynccontextmanager
async def trusting_agent(bus: Bus, store: Store) -> AsyncIterator[tuple[Service, str]]:
    async with running_agent(bus, store, grant_signers=[SIGNER.public_key]) as svc:
        yield svc, f"{svc.kit.config.node_prefix}-001"


async def test_only_grants_the_allocator_signed_run_and_forged_replayed_or_conflicting_ones_never(
    bus: Bus, store: Store
) -> None:
    async with trusting_agent(bus, store) as (svc, node):
        good = grant(node, [0, 1], runtime_s=600)
        await publish(bus, good)
        await eventually(lambda: started(bus, good.job_id), what="the signed grant running")

        unsigned = grant(node, [2])
        stranger = grant(node, [3])
        tampered = grant(node, [0])  # signed for GPU 0, changed to GPU 7 on the way
        replayed = msgspec.structs.replace(grant(node, [4]), lease_expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(1))
        conflicting = grant(node, [1])  # GPU 1 runs the good grant's work
        await publish(bus, unsigned, signer=None)
        await publish(bus, stranger, signer=GrantSigner(new_seed()))
        await publish(bus, tampered, tamper=True)
        await publish(bus, replayed)
        await publish(bus, conflicting)
        # a forged revocation of the running work is refused too
        revoke = AllocationRevoked(
            source="attacker",
            key=node,
            allocation_id=good.allocation_id,
            job_id=good.job_id,
            node_id=node,
            ledger_version=9,
            reason="forged",
        )
        await publish(bus, revoke, signer=None)

        async def all_refused() -> bool:
            return len(await refusals(bus, svc)) == 6

        await eventually(all_refused, what="six refusals dead-lettered")
        reasons = await refusals(bus, svc)
        assert all(r.startswith("refused: ") for r in reasons), reasons
        joined = " | ".join(reasons)
        for expected in (
            "not signed by the pool allocator",
            "a key this agent does not trust",
            "does not match the message",
            "(a replay)",
            f"GPU 1 of {node} runs allocation {good.allocation_id}",
        ):
            assert expected in joined, (expected, reasons)
        for forged in (unsigned, stranger, tampered, replayed, conflicting):
            assert not await started(bus, forged.job_id), forged.job_id
        running = {w.allocation_id for w in await agent_state.running(store.pool)}
        assert running == {good.allocation_id}  # the forged revocation stopped nothing
        durable = svc.consumers[0].sub.durable
        counted = svc.kit.metrics.registry.get_sample_value(
            "ibpool_events_dead_lettered_total", {"consumer": durable, "why": "refused"}
        )
        assert counted == 6


async def test_the_allocator_signs_and_a_trusting_agent_runs_what_it_grants(
    bus: Bus, store: Store, stack: StackInfo, tmp_path: Path
) -> None:
    seed_file = tmp_path / "grant-signing.seed"
    seed_file.write_text(SEED + "\n")
    async with (
        own_store(stack) as agent_store,
        trusting_agent(bus, agent_store) as (_, node),
        running_allocator(bus, store, grant_signing_seed_file=str(seed_file)) as (_, allocator),
    ):

        async def registered() -> bool:
            return node in allocator.ledger.nodes

        await eventually(registered, what="the agent's node in the allocator's ledger")
        job = f"signed-{new_id()}"
        assert (await allocator.submit(propose(job, node, 0, allocator.ledger.version))).granted
        await eventually(lambda: started(bus, job), what="the allocator's signed grant running")
        (stored,) = [
            m
            for m in await stream_messages(bus.js, "IBPOOL_POOL", AllocationGranted.subject(node))
            if job.encode() in m.data
        ]
        assert stored.headers["ibpool-signer"] == SIGNER.public_key
