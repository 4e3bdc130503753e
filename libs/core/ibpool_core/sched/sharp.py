"""SHARP (in-network reduction) for a placed gang: whether to turn it on, why not, and how.

SHARP aggregates a reduction in the switches of an aggregation tree instead of sending every
GPU's data through the hosts, which roughly halves the bytes a ring allreduce moves over the
fabric. A job can use it only when every switch between its hosts can aggregate, i.e. when the
gang's covering subtree (`FabricIndex.covering_subtree`) is SHARP-capable (`Subtree.sharp`: every
one of its switches has the SHARP flag). Subtrees are nested, so a gang that fits under a SHARP
subtree at one level fits under one at every lower level that holds it: the placement that keeps
the covering subtree smallest is also the one most likely to get SHARP.

Who gets it: a multi-node job unless it opted out (`wants_sharp=False`). `wants_sharp=None` means
"decide for me", and the scheduler decides yes for every multi-node gang, because in-network
reduction helps every data-parallel collective and costs the job nothing when it is off in NCCL's
tuning. A single-node job reduces over NVLink and never reaches the fabric.

What turns it on: NCCL loads the NCCL-RDMA-SHARP plugin (HPC-X / DOCA-Host) and uses its CollNet
transport when `NCCL_COLLNET_ENABLE=1`; the SHARP collective library's streaming aggregation trees
(SAT, the mode for large GPU reductions on Quantum-2) are turned on by `SHARP_COLL_ENABLE_SAT=1`.
Both names are from NVIDIA's HPC-X "NCCL-RDMA-SHARP Plugins" and SHARP "Collective Library" docs.
"""

from __future__ import annotations

import msgspec

from ..fabric.index import FabricIndex, Subtree

#: The environment a SHARP-enabled grant carries to every member of the gang.
SHARP_NCCL_ENV: dict[str, str] = {"NCCL_COLLNET_ENABLE": "1", "SHARP_COLL_ENABLE_SAT": "1"}


class SharpDecision(msgspec.Struct, frozen=True, kw_only=True):
    """enabled: SHARP is on for the placement; reason: why (or why not), one sentence for a person;
    env: the NCCL/SHARP settings to hand to the job (empty when disabled)."""

    enabled: bool
    reason: str
    env: dict[str, str] = {}


def sharp_wanted(nodes: int, wants_sharp: bool | None) -> bool:
    """True when the scheduler should try to place the job under a SHARP subtree: a multi-node job
    that did not opt out (None = decide: yes)."""
    return nodes > 1 and wants_sharp is not False


def decide_sharp(index: FabricIndex, nodes: int, wants_sharp: bool | None, covering: Subtree | None) -> SharpDecision:
    """Whether a gang of `nodes` hosts whose covering subtree is `covering` runs with SHARP.

    May assume: `covering` is the covering subtree of the gang's hosts in `index` (None when the
    hosts share no subtree). Pure: reads `index` only.
    """
    if nodes <= 1:
        return SharpDecision(enabled=False, reason="single-node job: its reductions stay on NVLink inside the host")
    if wants_sharp is False:
        return SharpDecision(enabled=False, reason="the job opted out of SHARP (wants_sharp=false)")
    if covering is not None and covering.sharp:
        where = f"level-{covering.level} subtree #{covering.index} ({len(covering.hosts)} hosts)"
        return SharpDecision(
            enabled=True, reason=f"every switch of the covering {where} is SHARP-capable", env=dict(SHARP_NCCL_ENV)
        )
    # the reasons below cost a scan of the switches; only placements without SHARP pay it
    if not any(switch.sharp for switch in index.topology.switches):
        return SharpDecision(enabled=False, reason="the fabric has no SHARP-capable switch")
    if covering is None:
        return SharpDecision(enabled=False, reason="the hosts share no subtree of the fabric")
    where = f"level-{covering.level} subtree #{covering.index} ({len(covering.hosts)} hosts)"
    return SharpDecision(
        enabled=False,
        reason=f"the gang's covering {where} has switches without SHARP; no SHARP subtree had room for it",
    )
