"""Per-tenant fair share with Slurm multifactor-style usage decay. Pure.

Usage is GPU-seconds, decayed with a half-life: usage(t) = usage(t0) * 2^(-(t - t0) / half_life)
plus what ran since. The factor of a tenant is Slurm's classic F = 2^(-U / S), with U its share of
all decayed usage and S its normalised share (equal shares unless given): F = 1 for a tenant that
used nothing, 0.5 for one that used exactly its share, towards 0 for heavy users. The priority
policy adds `fairshare_weight * F` to a job's score.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from ibpool_core.sched.records import JobRecord

DEFAULT_HALF_LIFE_S = 7 * 86_400.0  # Slurm's PriorityDecayHalfLife default


class FairShareState(msgspec.Struct, frozen=True, kw_only=True):
    usage_gpu_s: dict[str, float] = {}
    updated_at: float = 0.0


def accrue(
    state: FairShareState, now: float, gpus_by_tenant: Mapping[str, int], half_life_s: float = DEFAULT_HALF_LIFE_S
) -> FairShareState:
    """Decay every tenant's usage to `now` and charge `gpus_by_tenant` for the time since the last update.

    Callers call it at least at every change of the running set, or periodically (the simulator
    does it at every priority refresh): GPUs held over the interval are charged as if held all along.
    """
    elapsed = max(0.0, now - state.updated_at)
    decay = 0.5 ** (elapsed / half_life_s)
    usage = {tenant: used * decay for tenant, used in state.usage_gpu_s.items()}
    for tenant, gpus in gpus_by_tenant.items():
        usage[tenant] = usage.get(tenant, 0.0) + gpus * elapsed
    return FairShareState(usage_gpu_s=usage, updated_at=now)


def fairshare_factors(
    state: FairShareState, tenants: list[str] | None = None, shares: Mapping[str, float] | None = None
) -> dict[str, float]:
    """F = 2^(-U/S) per tenant (the tenants of `state`, plus `tenants`); 1.0 for all while nothing ran."""
    names = sorted(set(state.usage_gpu_s) | set(tenants or ()))
    if not names:
        return {}
    total_usage = sum(state.usage_gpu_s.values())
    raw_shares = {t: (shares.get(t, 1.0) if shares else 1.0) for t in names}
    total_shares = sum(raw_shares.values()) or 1.0
    factors = {}
    for tenant in names:
        used = state.usage_gpu_s.get(tenant, 0.0) / total_usage if total_usage > 0 else 0.0
        share = raw_shares[tenant] / total_shares
        factors[tenant] = 2.0 ** (-used / share) if share > 0 else 0.0
    return factors


def seeded_usage(
    history: Sequence[tuple[str, int, float, dt.datetime]],
    live: Sequence[JobRecord],
    now: dt.datetime,
    half_life_s: float,
) -> FairShareState:
    """Fair-share usage at `now` from the job history: each ended job's GPU-seconds, decayed from
    when it ended, plus what the jobs holding GPUs used since they started (decay inside a job's
    run is not modelled). What a new leader starts from."""
    usage: dict[str, float] = {}
    for tenant, gpus, runtime_s, ended in history:
        age = max(0.0, (now - ended).total_seconds())
        usage[tenant] = usage.get(tenant, 0.0) + gpus * runtime_s * 0.5 ** (age / half_life_s)
    for job in live:
        since = job.started_at or job.scheduled_at
        if job.holding and since is not None:
            usage[job.tenant] = usage.get(job.tenant, 0.0) + job.gpus * max(0.0, (now - since).total_seconds())
    return FairShareState(usage_gpu_s=usage, updated_at=now.timestamp())
