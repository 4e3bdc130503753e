"""Job exits -> whose fault: the hardware's (counts against the job's luck and the node) or the job's own.

Pure. A job that exits because of an XID or because its node was lost was hit by hardware; OOM,
its own failure, a signal, a revoke (already counted when the controller asked for it) and
completion are not. `requeue_backoff_s` spaces retries exponentially so a job does not bounce
between failing nodes; `flagged` says when a job has been hit often enough to need a human.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ibpool_proto.job import ExitReason

Blame = Literal["hardware", "job", "none"]

_BLAME: dict[ExitReason, Blame] = {
    "completed": "none",
    "failed": "job",
    "oom": "job",
    "xid": "hardware",
    "signal": "job",
    "revoked": "none",
    "lost": "hardware",
}


class RetryRules(msgspec.Struct, frozen=True, kw_only=True):
    # Backoff before the n-th retry: none for the first, then base * 2**(n-2), at most max.
    requeue_backoff_s: float = 1.0
    requeue_backoff_max_s: float = 300.0
    # A job hit by hardware this many times is flagged (JobFlagged, once).
    flag_after_failures: int = 3
    # Past this many hardware hits no more requeues are requested; the flag says why.
    max_requeues: int = 5


def blame(reason: ExitReason) -> Blame:
    return _BLAME[reason]


def requeue_backoff_s(attempt: int, rules: RetryRules) -> float:
    """Wait before placing a job again after its `attempt`-th hardware hit (1-based): none after the
    first (the node that failed is the likely cause: run the job again elsewhere at once), then
    doubling from `requeue_backoff_s`, so a job that keeps being hit does not bounce between nodes."""
    if attempt <= 1:
        return 0.0
    return float(min(rules.requeue_backoff_max_s, rules.requeue_backoff_s * 2 ** (attempt - 2)))


def flagged(failures: int, rules: RetryRules) -> bool:
    return failures >= rules.flag_after_failures


def may_requeue(failures: int, rules: RetryRules) -> bool:
    return failures <= rules.max_requeues
