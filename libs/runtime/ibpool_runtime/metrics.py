"""Prometheus metrics every service exposes on /metrics (one registry per service)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

Role = Callable[[], str]


class ServiceMetrics:
    def __init__(self, service: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"service": service}
        self.handled = Counter(
            "ibpool_events_handled", "Events handled and acked", ["consumer", "type"], registry=self.registry
        )
        self.failed = Counter(
            "ibpool_events_failed",
            "Handler failures (nak'd for redelivery)",
            ["consumer", "type"],
            registry=self.registry,
        )
        self.dead_lettered = Counter(
            "ibpool_events_dead_lettered", "Messages sent to IBPOOL_DLQ", ["consumer", "why"], registry=self.registry
        )
        self.dead_letter_failures = Counter(
            "ibpool_events_dead_letter_failures",
            "Dead letters IBPOOL_DLQ did not take (the message was not acked)",
            ["consumer"],
            registry=self.registry,
        )
        self.consumers_recreated = Counter(
            "ibpool_consumers_recreated",
            "Durable consumers found deleted and made again",
            ["consumer"],
            registry=self.registry,
        )
        self.duplicates = Counter(
            "ibpool_events_duplicate",
            "Redelivered events the inbox had already seen",
            ["consumer"],
            registry=self.registry,
        )
        self.handler_seconds = Histogram(
            "ibpool_handler_seconds",
            "Time in a handler",
            ["consumer"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        )
        self.outbox_lag = Gauge(
            "ibpool_outbox_lag", "Outbox rows committed but not yet published", registry=self.registry
        )
        self.consumer_pending = Gauge(
            "ibpool_consumer_pending",
            "Messages in the stream not yet delivered to the consumer",
            ["consumer"],
            registry=self.registry,
        )
        self.loop_failures = Counter(
            "ibpool_loop_failures",
            "Failures a service loop survived and tried again after (an outage of the bus or the store,"
            " bad input it skipped), by loop and exception class",
            ["loop", "error"],
            registry=self.registry,
        )
        self.info = Gauge("ibpool_service_info", "Service identity", ["service"], registry=self.registry)
        self.info.labels(**labels).set(1)
        # "active" until the service says who it is (`follow_role`): one without leader election leads.
        self.role: Role = _active
        self.registry.register(_LeaderCollector(service, self))

    def follow_role(self, role: Role) -> None:
        """Read `role()` at every scrape for `ibpool_service_leader`: "standby" is 0, anything else
        ("leader", "active") 1."""
        self.role = role

    def loop_failed(self, loop: str, error: BaseException) -> None:
        """Count one failure that `loop` survived (`ibpool_loop_failures{loop, error}`)."""
        self.loop_failures.labels(loop, type(error).__name__).inc()


def _active() -> str:
    return "active"


class _LeaderCollector(Collector):
    """`ibpool_service_leader{service}`: 1 while this instance leads (or elects no leader), 0 on a standby,
    read at scrape time, so that dashboards can count only the replica whose picture is current."""

    def __init__(self, service: str, metrics: ServiceMetrics) -> None:
        self.service = service
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        leader = GaugeMetricFamily(
            "ibpool_service_leader",
            "1 while this instance is the active leader (or its service elects none), 0 while it stands by",
            labels=["service"],
        )
        leader.add_metric([self.service], 0.0 if self.metrics.role() == "standby" else 1.0)
        yield leader


def count_failure(metrics: ServiceMetrics | None, loop: str, error: BaseException) -> None:
    """`metrics.loop_failed(loop, error)`, for the pieces whose metrics are optional (None: not counted)."""
    if metrics is not None:
        metrics.loop_failed(loop, error)
