"""GPUs per model and state, in GPUs (a fraction or a MIG slice counts as its share): what /metrics
says of the pool (`ibpool_pool_gpus`, `ibpool_pool_capacity_gpus`). Pure: it reads a ledger.

Every GPU is in exactly one state, so the states of a model add up to its GPUs:
- `failed`: the GPU or its node failed;
- `draining`: its node is draining (work moves off it; nothing new is placed there);
- `cordoned`: the GPU or its node is cordoned (a leaf cordon, which keeps only multi-node work
  off a node, does not count);
- otherwise schedulable, split into `allocated` (the share granted) and `free` (the rest).
Schedulable capacity is `allocated` + `free`: without failed, draining and cordoned GPUs.
"""

from __future__ import annotations

from typing import Literal

from ibpool_core.pool.ledger import WHOLE, Ledger

GpuState = Literal["free", "allocated", "cordoned", "draining", "failed"]
GPU_STATES: tuple[GpuState, ...] = ("free", "allocated", "cordoned", "draining", "failed")


def gpu_states(ledger: Ledger) -> dict[str, dict[GpuState, float]]:
    """model -> state -> GPUs in that state (every state, 0.0 included), models sorted."""
    milli: dict[str, dict[GpuState, int]] = {}
    for node in ledger.nodes.values():
        for g in node.gpus:
            t = milli.setdefault(g.model, dict.fromkeys(GPU_STATES, 0))
            if node.failed or g.failed:
                t["failed"] += WHOLE
            elif node.draining:
                t["draining"] += WHOLE
            elif node.cordoned or g.cordoned:
                t["cordoned"] += WHOLE
            else:
                t["allocated"] += g.granted_milli
                t["free"] += g.free_milli
    return {model: {state: m / WHOLE for state, m in states.items()} for model, states in sorted(milli.items())}


def schedulable(states: dict[GpuState, float]) -> float:
    """The schedulable capacity of one model's `gpu_states`: its GPUs neither failed, draining nor cordoned."""
    return states["allocated"] + states["free"]
