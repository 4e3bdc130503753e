"""Pool allocator configuration (env `IBPOOL_POOL_ALLOCATOR_<FIELD>` or TOML `[pool_allocator]`)."""

from __future__ import annotations

from ibpool_runtime.config import BaseConfig, Positive
from ibpool_runtime.fabric_feed import FabricFormat


class PoolAllocatorConfig(BaseConfig, frozen=True, kw_only=True):
    # Remote grants farther than this many fabric hops from the client are refused.
    max_remote_hops: int = 4
    # Off: a proposal is stale when anything on a node it names changed after its ledger version.
    fine_grained: bool = True
    # How often leases are checked for expiry.
    expiry_interval_s: float = 1.0
    # How often the ledger is snapshotted (when it changed): the store deletes the log before the
    # snapshot, and ledger replicas start from it. Far below the pool stream's max age (30 days).
    snapshot_interval_s: Positive = 600.0
    # Lease of a grant made through the HTTP API when the request names none.
    default_lease_s: float = 300.0
    # Durable consumer names start with this (commands, nodes, health; fabric-<instance> per replica).
    durable_prefix: str = "pool-allocator"
    # Packing policy placing RequestAllocation (ibpool_core.pool.policies.POLICIES): first-fit,
    # best-fit, worst-fit, dot-product, fgd, fgd+. Gangs go under as few fabric leaf groups as
    # possible and remote requests to the nearest nodes, when the fabric is known.
    placement_policy: str = "fgd+"
    # A topology file read at start (for clusters without a fabric monitor), in any format
    # ibpool_core.fabric.formats reads; "auto": native for .json/.yaml/.yml, slurm for a
    # topology.conf, ibnetdiscover otherwise. A topology published later replaces it.
    fabric_file: str = ""
    fabric_format: FabricFormat = "auto"
    # Bound on fetching a published topology from its URL (connect + read).
    fabric_fetch_timeout_s: float = 10.0
    # A file holding the nkeys seed (`SU...`) the allocator signs what node agents act on with
    # (grants, revocations, releases, expiries; `ibpool_runtime.grant_signing`); agents trust its
    # public key (`grant_signers`). Empty: nothing is signed (development only; said at start).
    grant_signing_seed_file: str = ""
