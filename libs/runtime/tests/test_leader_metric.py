"""`ibpool_service_leader{service}`: 1 while leading or electing none, 0 on a standby, read at scrape time."""

from __future__ import annotations

from ibpool_runtime.metrics import ServiceMetrics


def leader(metrics: ServiceMetrics) -> float | None:
    return metrics.registry.get_sample_value("ibpool_service_leader", {"service": "svc"})


def test_a_service_without_election_leads() -> None:
    assert leader(ServiceMetrics("svc")) == 1.0


def test_the_role_is_read_at_every_scrape() -> None:
    metrics = ServiceMetrics("svc")
    role = ["standby"]
    metrics.follow_role(lambda: role[0])
    assert leader(metrics) == 0.0
    role[0] = "leader"
    assert leader(metrics) == 1.0
