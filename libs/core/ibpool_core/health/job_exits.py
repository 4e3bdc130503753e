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
    # Backoff before the n-th retry: base * 2**(n-1), at most max.
    requeue_backoff_s: float = 1.0
    requeue_backoff_max_s: float = 300.0
    # A job hit by hardware this many times is flagged (JobFlagged, once).
    flag_after_failures: int = 3
    # Past this many hardware hits no more requeues are requested; the flag says why.
    max_requeues: int = 5


def blame(reason: ExitReason) -> Blame:
    return _BLAME[reason]


def requeue_backoff_s(attempt: int, rules: RetryRules) -> float:
    """Wait before placing a job again after its `attempt`-th hardware hit (1-based)."""
    if attempt <= 0:
        return 0.0
    return float(min(rules.requeue_backoff_max_s, rules.requeue_backoff_s * 2 ** (attempt - 1)))


def flagged(failures: int, rules: RetryRules) -> bool:
    return failures >= rules.flag_after_failures


def may_requeue(failures: int, rules: RetryRules) -> bool:
    return failures <= rules.max_requeues
