"""Job exits: whose fault, retry backoff, flags."""

import pytest

from ibpool_core.health.job_exits import RetryRules, blame, flagged, may_requeue, requeue_backoff_s

RULES = RetryRules(requeue_backoff_s=2.0, requeue_backoff_max_s=30.0, flag_after_failures=3, max_requeues=4)


@pytest.mark.parametrize(
    ("reason", "want"),
    [
        ("completed", "none"),
        ("failed", "job"),
        ("oom", "job"),
        ("signal", "job"),
        ("revoked", "none"),
        ("xid", "hardware"),
        ("lost", "hardware"),
    ],
)
def test_blame(reason: str, want: str) -> None:
    assert blame(reason) == want  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("attempt", "want"), [(0, 0.0), (1, 0.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 16.0), (6, 30.0), (9, 30.0)]
)
def test_the_first_retry_is_at_once_then_the_backoff_doubles_up_to_the_cap(attempt: int, want: float) -> None:
    assert requeue_backoff_s(attempt, RULES) == want


@pytest.mark.parametrize(
    ("failures", "is_flagged", "requeue"),
    [(1, False, True), (2, False, True), (3, True, True), (4, True, True), (5, True, False)],
)
def test_flag_and_requeue_limits(failures: int, is_flagged: bool, requeue: bool) -> None:
    assert flagged(failures, RULES) is is_flagged
    assert may_requeue(failures, RULES) is requeue
