"""The messages of the pool ledger, and the union of everything it publishes."""

from __future__ import annotations

from ibpool_proto.pool import (
    AllocationExpired,
    AllocationGranted,
    AllocationRejected,
    AllocationReleased,
    AllocationRevoked,
    LeaseRenewed,
    PoolGpu,
    PoolNodeUpdated,
    ProposePlacement,
    QuotaChanged,
    RequestAllocation,
    SetQuota,
)

__all__ = [
    "AllocationGranted",
    "LeaseRenewed",
    "LedgerEvent",
    "PoolGpu",
    "PoolNodeUpdated",
    "ProposePlacement",
    "QuotaChanged",
    "RequestAllocation",
    "SetQuota",
]

LedgerEvent = (
    AllocationGranted
    | AllocationRejected
    | AllocationReleased
    | AllocationRevoked
    | AllocationExpired
    | LeaseRenewed
    | PoolNodeUpdated
    | QuotaChanged
)
"""Everything the ledger publishes; replayed in order, it rebuilds the ledger."""
