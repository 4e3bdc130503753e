"""GPUs per model and state from a ledger: every GPU in one state, fractions and MIG slices as their share."""

from __future__ import annotations

from ibpool_core.pool.ledger import Gpu, Ledger, Node
from ibpool_pool_allocator.gpu_states import GPU_STATES, gpu_states, schedulable


def gpu(index: int, model: str = "H100", granted_milli: int = 0, **flags: bool) -> Gpu:
    return Gpu(index=index, uuid=f"GPU-{index}", model=model, memory_mib=81_920, granted_milli=granted_milli, **flags)


def ledger_of(*nodes: Node) -> Ledger:
    ledger = Ledger()
    ledger.nodes = {n.node_id: n for n in nodes}
    return ledger


def test_ready_gpus_split_into_their_granted_share_and_the_rest() -> None:
    node = Node(node_id="n1", gpus=(gpu(0, granted_milli=1000), gpu(1, granted_milli=250), gpu(2), gpu(3)))
    states = gpu_states(ledger_of(node))["H100"]
    assert states == {"free": 2.75, "allocated": 1.25, "cordoned": 0.0, "draining": 0.0, "failed": 0.0}
    assert schedulable(states) == 4.0


def test_failed_draining_and_cordoned_gpus_are_whole_and_not_schedulable() -> None:
    nodes = [
        Node(node_id="failed", failed=True, draining=True, gpus=(gpu(0, granted_milli=1000), gpu(1))),
        Node(node_id="draining", draining=True, gpus=(gpu(0, granted_milli=500), gpu(1))),
        Node(node_id="cordoned", cordoned=True, gpus=(gpu(0),)),
        Node(node_id="mixed", gpus=(gpu(0, failed=True), gpu(1, cordoned=True), gpu(2, granted_milli=125))),
        Node(node_id="leaf", leaf_cordoned=True, gpus=(gpu(0),)),  # still takes single-node work
    ]
    states = gpu_states(ledger_of(*nodes))["H100"]
    assert states == {"free": 1.875, "allocated": 0.125, "cordoned": 2.0, "draining": 2.0, "failed": 3.0}
    assert sum(states.values()) == 9.0
    assert schedulable(states) == 2.0


def test_models_are_apart_and_every_state_is_reported() -> None:
    node = Node(node_id="n", gpus=(gpu(0, "H100"), gpu(1, "A100", granted_milli=1000)))
    by_model = gpu_states(ledger_of(node))
    assert list(by_model) == ["A100", "H100"]
    assert all(tuple(states) == GPU_STATES for states in by_model.values())
    assert by_model["A100"]["allocated"] == 1.0 and by_model["H100"]["free"] == 1.0


def test_an_empty_pool_has_no_models() -> None:
    assert gpu_states(Ledger()) == {}
