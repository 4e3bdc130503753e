"""examples/subscriber.py against a real JetStream: resumes with no gap, and a crash between applying
and acking causes a redelivery with no second effect."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from ibpool_proto import Message, utc_now
from ibpool_proto.pool import (
    AllocationExpired,
    AllocationGranted,
    AllocationReleased,
    Enforcement,
    GpuAssignment,
)
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo

ROOT = Path(__file__).resolve().parents[2]
SUBSCRIBER = ROOT / "examples" / "subscriber.py"
ACK_WAIT_S = "1"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def granted(node: str, n: int, *, gpus: int = 2) -> AllocationGranted:
    return AllocationGranted(
        source="test-subscriber",
        key=node,
        allocation_id=f"{node}-alloc-{n}",
        job_id=f"{node}-job-{n}",
        node_id=node,
        kind="whole",
        assignments=[GpuAssignment(node_id=node, gpu_index=i) for i in range(gpus)],
        enforcement=Enforcement(visible_devices=[str(i) for i in range(gpus)]),
        lease_expires_at=utc_now() + dt.timedelta(minutes=5),
        ledger_version=n,
        tenant="acme",
    )


async def publish(bus: Bus, *messages: Message) -> None:
    for m in messages:
        await bus.publish(m)


async def run_subscriber(
    stack: StackInfo, durable: str, state: Path, node: str, *args: str, env: dict[str, str] | None = None
) -> tuple[int, list[str]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SUBSCRIBER),
        "--nats",
        stack.nats_url,
        "--durable",
        durable,
        "--state",
        str(state),
        "--key",
        node,
        "--ack-wait",
        ACK_WAIT_S,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    lines = out.decode().splitlines()
    assert proc.returncode is not None
    output = f"{out.decode()}\n{err.decode()}"
    assert proc.returncode in (0, 3), f"subscriber failed ({proc.returncode}):\n{output}"
    return proc.returncode, lines


def outcomes(lines: list[str], outcome: str) -> list[str]:
    """The ce-ids of the lines with this outcome (`applied`, `duplicate`, ...)."""
    return [line.split("ce-id=")[1].split()[0] for line in lines if line.startswith(outcome + " ")]


def read_state(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


async def test_resumes_where_it_stopped_with_no_gap(stack: StackInfo, bus: Bus, tmp_path: Path) -> None:
    node, durable, state = unique("subnode"), unique("billing"), tmp_path / "billing.json"
    first = [granted(node, n) for n in range(5)]
    await publish(bus, *first)

    code, lines = await run_subscriber(stack, durable, state, node, "--max", "3")
    assert code == 0
    assert outcomes(lines, "applied") == [m.id for m in first[:3]]
    assert len(read_state(state)["allocations"]) == 3

    second: list[Message] = [granted(node, n) for n in range(5, 8)]
    second += [
        AllocationReleased(
            source="t",
            key=node,
            allocation_id=first[0].allocation_id,
            job_id=first[0].job_id,
            node_id=node,
            ledger_version=10,
        ),
        AllocationExpired(
            source="t",
            key=node,
            allocation_id=first[3].allocation_id,
            job_id=first[3].job_id,
            node_id=node,
            ledger_version=11,
        ),
    ]
    await publish(bus, *second)
    code, lines = await run_subscriber(stack, durable, state, node, "--idle-exit", "2")
    assert code == 0
    assert outcomes(lines, "applied") == [m.id for m in [*first[3:], *second]], lines
    assert outcomes(lines, "duplicate") == []

    final = read_state(state)
    everything = [*first, *second]
    assert final["processed"] == [m.id for m in everything]  # each once, in stream order: no gap
    assert sorted(final["allocations"]) == sorted(f"{node}-alloc-{n}" for n in range(8))
    nodes = {aid: a["nodes"][node] for aid, a in final["allocations"].items()}
    assert nodes[first[0].allocation_id]["state"] == "released"
    assert nodes[first[3].allocation_id]["state"] == "expired"
    assert sum(n["state"] == "granted" for n in nodes.values()) == 6
    assert final["gpu_milli_granted"] == {"acme": 8 * 2 * 1000}


async def test_crash_after_apply_before_ack_has_no_second_effect(stack: StackInfo, bus: Bus, tmp_path: Path) -> None:
    node, durable, state = unique("subnode"), unique("billing"), tmp_path / "billing.json"
    events = [granted(node, n, gpus=4) for n in range(3)]
    await publish(bus, *events)

    code, lines = await run_subscriber(
        stack, durable, state, node, "--idle-exit", "2", env={"SUBSCRIBER_CRASH_AFTER_APPLY": "1"}
    )
    assert code == 3, lines
    assert outcomes(lines, "crash") == [events[0].id]
    crashed = read_state(state)
    assert crashed["processed"] == [events[0].id]
    assert crashed["gpu_milli_granted"] == {"acme": 4000}

    # The first event was applied and never acked: JetStream redelivers it after ack_wait.
    code, lines = await run_subscriber(stack, durable, state, node, "--idle-exit", "4")
    assert code == 0
    assert outcomes(lines, "duplicate") == [events[0].id], lines
    assert sorted(outcomes(lines, "applied")) == sorted(m.id for m in events[1:])

    final = read_state(state)
    assert sorted(final["processed"]) == sorted(m.id for m in events)
    assert len(final["processed"]) == 3
    assert len(final["allocations"]) == 3
    assert final["gpu_milli_granted"] == {"acme": 3 * 4000}  # not 4 * 4000: no double effect


async def test_invalid_payload_is_rejected_without_effect(stack: StackInfo, bus: Bus, tmp_path: Path) -> None:
    node, durable, state = unique("subnode"), unique("billing"), tmp_path / "billing.json"
    good = granted(node, 1)
    ce_id = str(uuid.uuid4())
    bad_headers = {
        "ce-id": ce_id,
        "Nats-Msg-Id": ce_id,
        "ce-type": AllocationGranted.ce_type(),
        "ce-specversion": "1.0",
        "ce-source": "test",
        "content-type": "application/json",
    }
    bad_body = json.dumps({"type": AllocationGranted.ce_type(), "source": "t", "key": node}).encode()
    await bus.js.publish(AllocationGranted.subject(node), bad_body, headers=bad_headers)
    await publish(bus, good)

    code, lines = await run_subscriber(stack, durable, state, node, "--idle-exit", "2")
    assert code == 0
    assert outcomes(lines, "invalid") == [ce_id]
    assert outcomes(lines, "applied") == [good.id]
    assert list(read_state(state)["allocations"]) == [good.allocation_id]
