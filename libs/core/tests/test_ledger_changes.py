"""The ledger's change logs (`node_changes`, `allocation_changes`) name every node and allocation
the ledger replaced, added or removed, event by event: what the scheduler's cycle reads instead of
comparing every node and every held allocation. Not part of the ledger's value."""

from __future__ import annotations

import copy

from ibpool_core.pool import allocate as al
from ibpool_core.pool.ledger import Ledger, allocation_changes, apply, decode_ledger, encode_ledger, node_changes
from ibpool_proto.health import Cordoned, NodeFailed, Uncordoned

from .busy_ledger import T0, busy_ledger, node_id


def replaced(before: dict[str, object], after: dict[str, object]) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) is not after.get(k)}


def test_every_replaced_node_and_allocation_is_logged_event_by_event() -> None:
    busy = busy_ledger(24, past=120)
    ledger = Ledger(past_kept=busy.ledger.past_kept)
    nodes, allocations = node_changes(ledger), allocation_changes(ledger)
    counted = {"nodes": 0, "allocations": 0}

    def check(step: object) -> None:
        got_nodes = set(nodes.changes_since(*seen_nodes) or ())
        got_allocations = set(allocations.changes_since(*seen_allocations) or ())
        assert replaced(before_nodes, dict(ledger.nodes)) <= got_nodes, step
        assert replaced(before_allocations, dict(ledger.allocations)) <= got_allocations, step
        counted["nodes"] += len(got_nodes)
        counted["allocations"] += len(got_allocations)

    for event in busy.events:
        before_nodes, before_allocations = dict(ledger.nodes), dict(ledger.allocations)
        seen_nodes, seen_allocations = (nodes.token, nodes.version), (allocations.token, allocations.version)
        apply(ledger, [event])
        check(event)
    assert ledger == busy.ledger
    for health in (
        Cordoned(source="f", key=node_id(3), node_id=node_id(3), scope="node", reason="hot"),
        Cordoned(source="f", key=node_id(4), node_id=node_id(4), scope="gpu", gpu_index=2, reason="xid"),
        Uncordoned(source="f", key=node_id(3), node_id=node_id(3), scope="node", reason="ok"),
        NodeFailed(source="f", key=node_id(5), node_id=node_id(5), reason="silent"),  # revokes its work
    ):
        before_nodes, before_allocations = dict(ledger.nodes), dict(ledger.allocations)
        seen_nodes, seen_allocations = (nodes.token, nodes.version), (allocations.token, allocations.version)
        al.handle(ledger, health, T0)
        check(health)
    assert counted["nodes"] > 100 and counted["allocations"] > 100, counted


def test_the_logs_are_not_part_of_the_ledger() -> None:
    ledger = busy_ledger(4, past=10).ledger
    assert node_changes(ledger).version > 0
    decoded = decode_ledger(encode_ledger(ledger))
    assert node_changes(decoded).version == 0 and encode_ledger(decoded) == encode_ledger(ledger)
    twin = copy.deepcopy(ledger)
    assert twin == ledger  # compared without them
    assert node_changes(twin).changes_since(node_changes(ledger).token, 0) is None  # a copy has its own
