"""The allocator's glue without a database: log positions, the pool view, config."""

from __future__ import annotations

import datetime as dt
from typing import Any

from ibpool_core.pool.allocate import handle
from ibpool_core.pool.ledger import Ledger
from ibpool_pool_allocator import state
from ibpool_pool_allocator.api import pool_view
from ibpool_pool_allocator.config import PoolAllocatorConfig
from ibpool_proto.node import GpuInfo, NodeRegistered
from ibpool_proto.pool import GpuAssignment, ProposePlacement
from ibpool_runtime.config import load_config

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class RecordingConn:
    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    async def executemany(self, _sql: str, rows: list[tuple[Any, ...]]) -> None:
        self.rows += rows


def ledger_with_one_grant() -> tuple[Ledger, list[Any]]:
    ledger = Ledger()
    reg = NodeRegistered(
        source="t",
        key="n1",
        node_id="n1",
        hostname="n1",
        cpu_milli=8000,
        memory_mib=64_000,
        gpus=[GpuInfo(index=i, uuid=f"u{i}", model="H100", memory_mib=80_000) for i in range(2)],
        backend="test",
    )
    events = list(handle(ledger, reg, NOW).events)
    cmd = ProposePlacement(
        source="t",
        key="j",
        job_id="j",
        tenant="t",
        queue="q",
        ledger_version=ledger.version,
        assignments=[GpuAssignment(node_id="n1", gpu_index=1, milli=250, memory_mib=20_000)],
    )
    events += handle(ledger, cmd, NOW).events
    return ledger, events


async def test_append_numbers_events_inside_their_version() -> None:
    _, events = ledger_with_one_grant()
    conn = RecordingConn()
    position = await state.append(conn, state.START, events)  # type: ignore[arg-type]
    versions = [(r[0], r[1]) for r in conn.rows]
    assert versions == [(e.ledger_version, 0) for e in events]
    assert position == versions[-1]
    again = await state.append(conn, position, events[-1:])  # type: ignore[arg-type]
    assert again == (position[0], 1)


def test_pool_view_counts_capacity_allocated_and_free() -> None:
    ledger, _ = ledger_with_one_grant()
    view = pool_view(ledger)
    (model,) = view.models
    assert (model.capacity_milli, model.allocated_milli, model.free_milli) == (2000, 250, 1750)
    (node,) = view.nodes
    assert [g.granted_milli for g in node.gpus] == [0, 250]
    assert view.ledger_version == ledger.version


def test_config_reads_env(monkeypatch: Any) -> None:
    monkeypatch.setenv("IBPOOL_POOL_ALLOCATOR_MAX_REMOTE_HOPS", "2")
    monkeypatch.setenv("IBPOOL_POOL_ALLOCATOR_EXPIRY_INTERVAL_S", "0.5")
    cfg = load_config(PoolAllocatorConfig, "pool_allocator")
    assert (cfg.max_remote_hops, cfg.expiry_interval_s) == (2, 0.5)
