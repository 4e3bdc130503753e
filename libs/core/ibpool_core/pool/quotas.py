"""Quotas per tenant and per queue, per GPU model, in GPU-milli and GPU memory, with cohort lending.

A `Quota` names a scope ("tenant" or "queue"), a name and a GPU model, and gives a nominal
(guaranteed) share, an optional borrowing limit, an optional lending limit and an optional
cohort, as Kueue's ClusterQueues do. An allocation counts, per GPU model it uses, the milli and
the memory it was granted there (a whole GPU 1000 and all its memory, a fraction its milli and
memory, a MIG instance its profile's), against its tenant's quota and its queue's quota.

The admission rule, checked when an allocation is committed, for the tenant's and the queue's
quota of every GPU model the allocation uses, in each dimension (milli, memory) on its own. A
scope, name and model without a quota is not limited. With u the member's usage, a what the
allocation adds there and n its nominal share:

1. u + a <= n: admitted. The guarantee holds even while cohort peers borrow the member's idle
   share; taking it back from them (reclaim) is preemption, the scheduler's decision.
2. Otherwise the member borrows u + a - n. Refused when it has no cohort; when a borrowing limit
   is set and u + a > n + borrowing_limit; or when the cohort cannot lend that much:

       sum over the cohort's members m of max(0, u_m - reserved_m)  >  sum over m of lendable_m

   with this member's u_m counted with a, lendable_m = min(lending_limit_m, n_m) (n_m when no
   lending limit is set) the part of m's share others may use while m leaves it idle, and
   reserved_m = n_m - lendable_m the part never lent. A cohort is the quotas with the same scope,
   cohort name and GPU model.

Lowering a quota below its usage revokes nothing: it only refuses further admissions until the
usage falls back under it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ibpool_proto.pool import Quota as Quota
from ibpool_proto.pool import QuotaScope
from ibpool_proto.pool import Share as Share

Scope = QuotaScope
QuotaKey = tuple[str, str, str]
"""(scope, name, GPU model)."""

_DIMENSIONS = (("milli", "milli"), ("memory_mib", "MiB"))


ZERO = Share()


def resolve_model(name: str, known: Iterable[str]) -> str:
    """The GPU model a quota names, as the pool knows it: `name` itself when known (or when the pool
    knows no model yet), else the one known model whose name has `name`'s words in it, ignoring case
    and punctuation ("h100" -> "NVIDIA H100 80GB HBM3", "a100" -> "NVIDIA A100-SXM4-80GB").
    ValueError naming the candidates when none or several do."""
    models = sorted(set(known))
    if name in models or not models:
        return name
    words = _words(name)
    found = [m for m in models if _has_words(_words(m), words)]
    if len(found) == 1:
        return found[0]
    if found:
        raise ValueError(f"GPU model {name!r} is ambiguous: it names {', '.join(found)}")
    raise ValueError(f"no GPU model {name!r} in the pool; it has {', '.join(models)}")


def _words(name: str) -> list[str]:
    """A model name's words, lower case: "NVIDIA A100-SXM4-80GB" -> nvidia, a100, sxm4, 80gb."""
    return [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]


def _has_words(words: list[str], wanted: list[str]) -> bool:
    """Whether `wanted` occurs in `words` as consecutive words."""
    n = len(wanted)
    return n > 0 and any(words[i : i + n] == wanted for i in range(len(words) - n + 1))


def problems(quota: Quota) -> list[str]:
    """What is wrong with a quota (empty when it is valid): negative amounts, empty names."""
    out = []
    if not quota.name or not quota.gpu_model:
        out.append("a quota needs a name and a GPU model")
    shares = {"nominal": quota.nominal, "borrowing_limit": quota.borrowing_limit, "lending_limit": quota.lending_limit}
    for label, share in shares.items():
        if share is not None and (share.milli < 0 or share.memory_mib < 0):
            out.append(f"{label} must not be negative")
    if quota.cohort == "":
        out.append("the cohort, when given, must not be empty")
    return out


def usage_keys(tenant: str, queue: str, gpu_model: str) -> tuple[QuotaKey, QuotaKey]:
    """The keys an allocation of `tenant` in `queue` on `gpu_model` counts against."""
    return (("tenant", tenant, gpu_model), ("queue", queue, gpu_model))


def cohort_of(quotas: Iterable[Quota], quota: Quota) -> list[Quota]:
    """The members of `quota`'s cohort (itself included); just itself when it has none."""
    if quota.cohort is None:
        return [quota]
    return [q for q in quotas if q.scope == quota.scope and q.cohort == quota.cohort and q.gpu_model == quota.gpu_model]


def refusal(
    quotas: Mapping[QuotaKey, Quota],
    usage: Mapping[QuotaKey, Share],
    tenant: str,
    queue: str,
    adds: Mapping[str, Share],
) -> str | None:
    """Why adding `adds` (GPU model -> share) for `tenant` in `queue` breaks a quota; None if it does not."""
    for model in sorted(adds):
        for key in usage_keys(tenant, queue, model):
            quota = quotas.get(key)
            if quota is None:
                continue
            why = _refusal(quota, quotas, usage, adds[model])
            if why is not None:
                return f"{quota.scope} {quota.name!r} on {model}: {why}"
    return None


def _refusal(quota: Quota, quotas: Mapping[QuotaKey, Quota], usage: Mapping[QuotaKey, Share], add: Share) -> str | None:
    members = cohort_of(quotas.values(), quota)
    for dim, unit in _DIMENSIONS:
        a = getattr(add, dim)
        if a <= 0:
            continue
        u = getattr(usage.get(quota.key, ZERO), dim)
        n = getattr(quota.nominal, dim)
        if u + a <= n:
            continue
        if quota.cohort is None:
            return f"{u} + {a} {unit} is over the nominal {n} and there is no cohort to borrow from"
        if quota.borrowing_limit is not None and u + a > n + getattr(quota.borrowing_limit, dim):
            limit = getattr(quota.borrowing_limit, dim)
            return f"{u} + {a} {unit} is over the nominal {n} plus the borrowing limit {limit}"
        lent = 0
        used = 0
        for m in members:
            lendable = getattr(m.lendable, dim)
            lent += lendable
            um = getattr(usage.get(m.key, ZERO), dim) + (a if m.key == quota.key else 0)
            used += max(0, um - (getattr(m.nominal, dim) - lendable))
        if used > lent:
            return (
                f"cohort {quota.cohort!r} cannot lend {u + a - n} {unit} (it would use {used} of the {lent} it pools)"
            )
    return None
