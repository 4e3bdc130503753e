"""What batch elasticity reads off the autoscaler's pool ledger replica (`ibpool_runtime.ledger_replica`):
which GPUs are idle, which jobs hold GPUs. Pure functions of the ledger."""

from __future__ import annotations

from ibpool_core.pool.ledger import Ledger


def idle_gpus(ledger: Ledger) -> int:
    """Whole GPUs nobody holds, on ready nodes, that are themselves ready (not failed, not cordoned)."""
    return sum(1 for n in ledger.nodes.values() if n.ready for g in n.gpus if g.ready and g.fits_whole())


def jobs_holding_gpus(ledger: Ledger) -> set[str]:
    """The jobs that hold an allocation in the ledger (placed, whatever their events said so far)."""
    return {a.job_id for a in ledger.allocations.values()}
