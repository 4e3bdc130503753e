"""Pool allocator configuration (env `IBPOOL_POOL_ALLOCATOR_<FIELD>` or TOML `[pool_allocator]`)."""

from __future__ import annotations

from ibpool_runtime.config import BaseConfig


class PoolAllocatorConfig(BaseConfig, frozen=True, kw_only=True):
    # Remote grants farther than this many fabric hops from the client are refused.
    max_remote_hops: int = 4
    # Off: a proposal is stale when anything on a node it names changed after its ledger version.
    fine_grained: bool = True
    # How often leases are checked for expiry.
    expiry_interval_s: float = 1.0
    # Lease of a grant made through the HTTP API when the request names none.
    default_lease_s: float = 300.0
    # Durable consumer names start with this (one consumer per stream: commands, nodes, health).
    durable_prefix: str = "pool-allocator"
    # Packing policy placing RequestAllocation (ibpool_core.pool.policies.POLICIES): first-fit,
    # best-fit, worst-fit, dot-product, fgd, fgd+. Gang and remote requests are placed by first fit.
    placement_policy: str = "fgd+"
