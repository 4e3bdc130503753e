"""Slurm domain: what a Slurm cluster beside ibpool shows, as the Slurm bridge reads it back."""

from __future__ import annotations

from typing import ClassVar

from .message import Event


class SlurmNodeChanged(Event, frozen=True, kw_only=True, tag="io.ibpool.slurm.node.changed.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = (
        "A Slurm node's state, reason or GPUs held by Slurm jobs changed, as `scontrol show node` shows it"
        " (the Slurm bridge publishes every node once when it starts)."
    )

    # The fabric host (ibpool's node id) and its Slurm node name.
    node_id: str
    slurm_node: str
    # Slurm's state flags, e.g. ["IDLE"], ["MIXED", "DRAIN"], ["DOWN"] ("*", not responding, dropped).
    state: list[str]
    reason: str = ""
    # True when the reason is ibpool's (`ibpool: ...`): a drain the bridge made.
    drained_by_ibpool: bool = False
    # GPUs Slurm knows on the node (CfgTRES gres/gpu) and those its jobs hold now (AllocTRES gres/gpu).
    gpus: int = 0
    gpus_allocated: int = 0
