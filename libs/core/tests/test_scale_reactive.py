"""The reactive policy, rule by rule: request -> reply (HPA formula, tolerance, windows, limits, bounds, zero)."""

from __future__ import annotations

import datetime as dt

import pytest

from ibpool_core.scale.model import (
    Deployment,
    MetricSample,
    MetricTarget,
    PolicyConfig,
    Recommendation,
    Replica,
    ReplicaShape,
    ScaleChange,
    ScalerMemory,
    ScalingReply,
    ScalingRequest,
)
from ibpool_core.scale.policies import decide, make_policy
from ibpool_core.scale.reactive import replicas_to_remove

T0 = dt.datetime(2026, 1, 5, 12, 0, tzinfo=dt.UTC)
RPS = [MetricTarget(metric="requests_per_s", value=7.5)]
UTIL = [MetricTarget(metric="gpu_utilization", value=0.6)]


def deployment(**kw: object) -> Deployment:
    base: dict[str, object] = {"name": "chat", "min_replicas": 1, "max_replicas": 100, "targets": RPS}
    base.update(kw)
    return Deployment(**base)  # type: ignore[arg-type]


def replicas(ready: int, starting: int = 0) -> list[Replica]:
    out = [
        Replica(replica_id=f"ready-{i}", state="ready", since=T0 - dt.timedelta(hours=1, seconds=i))
        for i in range(ready)
    ]
    out += [
        Replica(replica_id=f"starting-{i}", state="starting", since=T0 - dt.timedelta(seconds=60 - i))
        for i in range(starting)
    ]
    return out


def samples(span_s: float = 60.0, every_s: float = 15.0, **values: float | None) -> list[MetricSample]:
    """Equal samples every `every_s` over the last `span_s`, the last one at T0."""
    n = int(span_s // every_s)
    return [MetricSample(at=T0 - dt.timedelta(seconds=every_s * k), **values) for k in range(n, -1, -1)]


def ask(
    dep: Deployment,
    ready: int,
    starting: int = 0,
    metrics: list[MetricSample] | None = None,
    memory: ScalerMemory | None = None,
    policy: str = "reactive",
) -> ScalingReply:
    return decide(
        ScalingRequest(
            deployment=dep,
            replicas=replicas(ready, starting),
            metrics=metrics if metrics is not None else [],
            now=T0,
            policy=PolicyConfig(name=policy),
            memory=memory or ScalerMemory(),
        )
    )


@pytest.mark.parametrize(
    ("name", "dep", "ready", "rps", "util", "want"),
    [
        ("at target: nothing", deployment(), 4, 30.0, None, 4),
        ("10% over target is inside the tolerance", deployment(), 4, 33.0, None, 4),
        ("just past the tolerance scales by the formula", deployment(), 4, 33.2, None, 5),
        ("twice the target doubles", deployment(), 4, 60.0, None, 8),
        ("ceil of the formula", deployment(), 5, 61.0, None, 9),
        ("utilisation: ceil(ready * util / target)", deployment(targets=UTIL), 4, None, 0.9, 6),
        ("utilisation inside the tolerance", deployment(targets=UTIL), 4, None, 0.65, 4),
        ("several targets: the largest wins", deployment(targets=RPS + UTIL), 4, 45.0, 0.9, 6),
        ("several targets: the largest wins (other one)", deployment(targets=RPS + UTIL), 4, 75.0, 0.9, 8),
        ("no metric: keep", deployment(), 4, None, None, 4),
    ],
)
def test_scale_up_by_the_hpa_formula(
    name: str, dep: Deployment, ready: int, rps: float | None, util: float | None, want: int
) -> None:
    reply = ask(dep, ready, metrics=samples(requests_per_s=rps, gpu_utilization=util))
    assert reply.desired_replicas == want, (name, reply.reason)
    assert reply.add == max(0, want - ready)


@pytest.mark.parametrize(
    ("name", "target", "sample", "want"),
    [
        (
            "queue: ceil(total / per-replica target)",
            MetricTarget(metric="queue_length", value=10.0),
            MetricSample(at=T0, queue_length=95.0),
            10,
        ),
        (
            "p99 latency read as a utilisation",
            MetricTarget(metric="p99_latency_s", value=2.0),
            MetricSample(at=T0, p99_latency_s=3.0),
            8,
        ),
        (
            "p99 latency under target scales down",
            MetricTarget(metric="p99_latency_s", value=2.0),
            MetricSample(at=T0, p99_latency_s=1.0),
            4,
        ),
    ],
)
def test_queue_and_latency_targets(name: str, target: MetricTarget, sample: MetricSample, want: int) -> None:
    # 5 ready: the scale-up limit is max(10, 9) = 10 and the scale-down limit 4
    reply = ask(deployment(targets=[target]), 5, metrics=[sample])
    assert reply.desired_replicas == want, (name, reply.reason)


def test_replica_shape_is_whole_gpus_or_a_fraction() -> None:
    assert ReplicaShape(gpus=2).gpu_equivalent == 2.0
    assert ReplicaShape(gpus=0, gpu_milli=250, memory_mib=10240).gpu_equivalent == 0.25
    with pytest.raises(ValueError, match="whole GPUs or a fraction"):
        ReplicaShape(gpus=1, gpu_milli=500)
    with pytest.raises(ValueError, match="gpu_milli"):
        ReplicaShape(gpus=0, gpu_milli=1000)


def test_a_replica_spanning_hosts_holds_its_gpus_on_each() -> None:
    assert ReplicaShape(gpus=8, hosts=2).gpu_equivalent == 16.0
    with pytest.raises(ValueError, match="at least one host"):
        ReplicaShape(gpus=8, hosts=0)
    with pytest.raises(ValueError, match="hosts must be 1"):
        ReplicaShape(gpus=0, gpu_milli=500, hosts=2)


def test_metric_is_averaged_over_the_window() -> None:
    # 60 s window: the spike 2 minutes ago is out, the last minute averages (30 + 90) / 2 = 60 -> 8
    old = [MetricSample(at=T0 - dt.timedelta(seconds=120), requests_per_s=500.0)]
    recent = [
        MetricSample(at=T0 - dt.timedelta(seconds=30), requests_per_s=30.0),
        MetricSample(at=T0, requests_per_s=90.0),
    ]
    assert ask(deployment(), 4, metrics=old + recent).desired_replicas == 8


@pytest.mark.parametrize(
    ("name", "held", "raw_rps", "want"),
    [
        ("a high recommendation inside the window holds the scale-down", [(100, 10)], 30.0, 10),
        ("the highest in the window wins", [(250, 9), (100, 8)], 30.0, 9),
        ("recommendations older than 300 s do not hold", [(301, 10)], 30.0, 9),
        ("scale-up is not held", [(100, 4)], 150.0, 20),
    ],
)
def test_stabilisation_window_holds_scale_down(
    name: str, held: list[tuple[float, int]], raw_rps: float, want: int
) -> None:
    memory = ScalerMemory(
        recommendations=[Recommendation(at=T0 - dt.timedelta(seconds=ago), replicas=n) for ago, n in held]
    )
    reply = ask(deployment(), 10, metrics=samples(requests_per_s=raw_rps), memory=memory)
    assert reply.desired_replicas == want, (name, reply.reason)


def test_stabilisation_remembers_only_the_window() -> None:
    memory = ScalerMemory(
        recommendations=[Recommendation(at=T0 - dt.timedelta(seconds=s), replicas=5) for s in (10, 400)]
    )
    reply = ask(deployment(), 4, metrics=samples(requests_per_s=30.0), memory=memory)
    assert [r.at for r in reply.memory.recommendations] == [T0 - dt.timedelta(seconds=10), T0]


@pytest.mark.parametrize(
    ("name", "current", "rps", "changes", "want"),
    [
        ("up: +4 replicas beats +100% when small", 2, 150.0, [], 6),
        ("up: +100% beats +4 when large", 10, 300.0, [], 20),
        ("up: additions of the last 15 s count", 6, 150.0, [(10, 4)], 6),
        ("up: additions older than 15 s do not", 6, 150.0, [(16, 4)], 12),
        ("down: -10% per 60 s", 20, 7.5, [], 18),
        ("down: at least one replica per 60 s", 5, 7.5, [], 4),
        ("down: removals of the last 60 s count", 18, 7.5, [(30, -2)], 18),
        ("down: removals older than 60 s do not", 18, 7.5, [(61, -2)], 16),
    ],
)
def test_rate_limits(name: str, current: int, rps: float, changes: list[tuple[float, int]], want: int) -> None:
    memory = ScalerMemory(changes=[ScaleChange(at=T0 - dt.timedelta(seconds=ago), delta=d) for ago, d in changes])
    reply = ask(deployment(), current, metrics=samples(requests_per_s=rps), memory=memory)
    assert reply.desired_replicas == want, (name, reply.reason)
    assert reply.add == max(0, want - current)
    assert len(reply.remove) == max(0, current - want)


def test_a_change_is_remembered_for_the_rate_limit() -> None:
    reply = ask(deployment(), 2, metrics=samples(requests_per_s=150.0))
    assert reply.memory.changes == [ScaleChange(at=T0, delta=4)]


@pytest.mark.parametrize(
    ("name", "dep", "current", "rps", "want"),
    [
        ("min wins over a low recommendation", deployment(min_replicas=3), 3, 1.0, 3),
        ("below min: straight to min", deployment(min_replicas=3), 1, 1.0, 3),
        ("max wins over a high recommendation", deployment(max_replicas=10), 8, 300.0, 10),
        ("above max: straight to max", deployment(max_replicas=10), 14, 300.0, 10),
        ("min 0 without scale to zero keeps one", deployment(min_replicas=0), 1, 0.0, 1),
    ],
)
def test_min_and_max_bound_the_decision(name: str, dep: Deployment, current: int, rps: float, want: int) -> None:
    reply = ask(dep, current, metrics=samples(requests_per_s=rps))
    assert reply.desired_replicas == want, (name, reply.reason)


ZERO = {"scale_to_zero": True, "min_replicas": 1, "idle_window_s": 600.0, "cold_start_s": 60.0}


@pytest.mark.parametrize(
    ("name", "dep", "current", "metrics", "want"),
    [
        ("idle the whole window: to zero", deployment(**ZERO), 3, samples(660, requests_per_s=0.0), 0),
        (
            "traffic inside the window: stays at min",
            deployment(**ZERO),
            2,
            [*samples(660, requests_per_s=0.0)[:-1], MetricSample(at=T0, requests_per_s=0.5)],
            1,
        ),
        ("a queue is traffic", deployment(**ZERO), 2, samples(660, requests_per_s=0.0, queue_length=2.0), 1),
        ("history shorter than the window: not idle", deployment(**ZERO), 2, samples(300, requests_per_s=0.0), 1),
        (
            "a cold start over the budget forbids zero",
            deployment(**ZERO | {"cold_start_s": 400.0, "cold_start_budget_s": 300.0}),
            2,
            samples(660, requests_per_s=0.0),
            1,
        ),
        ("without scale to zero: min", deployment(min_replicas=1), 2, samples(660, requests_per_s=0.0), 1),
        ("at zero without traffic: stays", deployment(**ZERO), 0, samples(660, requests_per_s=0.0), 0),
        ("wake-up on traffic: the formula from zero", deployment(**ZERO), 0, samples(60, requests_per_s=20.0), 3),
        ("wake-up is rate limited", deployment(**ZERO), 0, samples(60, requests_per_s=200.0), 4),
        ("wake-up on a queue alone: min", deployment(**ZERO), 0, samples(60, requests_per_s=0.0, queue_length=3.0), 1),
    ],
)
def test_scale_to_zero_after_idle_and_wake_up(
    name: str, dep: Deployment, current: int, metrics: list[MetricSample], want: int
) -> None:
    reply = ask(dep, current, metrics=metrics)
    assert reply.desired_replicas == want, (name, reply.reason)
    assert reply.add == max(0, want - current)
    assert len(reply.remove) == max(0, current - want)


def test_scale_to_zero_is_not_held_by_the_window_or_the_rate_limit() -> None:
    memory = ScalerMemory(recommendations=[Recommendation(at=T0 - dt.timedelta(seconds=30), replicas=8)])
    reply = ask(deployment(**ZERO), 8, metrics=samples(660, requests_per_s=0.0), memory=memory)
    assert reply.desired_replicas == 0
    assert len(reply.remove) == 8
    assert "idle" in reply.reason


@pytest.mark.parametrize(
    ("name", "dep", "ready", "starting", "metrics", "want"),
    [
        # Utilisation is measured on the 2 ready replicas: 2 * 1.0 / 0.5 = 4, already held (2 + 2).
        ("util: starting replicas are not measured", deployment(targets=UTIL), 2, 2, samples(gpu_utilization=1.2), 4),
        # 30 requests/s need 4 at 7.5; 2 are ready and 2 are on the way: nothing more to start.
        ("rps: starting replicas are on the way", deployment(), 2, 2, samples(requests_per_s=30.0), 4),
        # No ready replica: no utilisation to read, so nothing is decided on it.
        ("util: none ready, keep", deployment(targets=UTIL), 0, 3, samples(gpu_utilization=0.0), 3),
    ],
)
def test_starting_replicas_are_not_counted_as_serving(
    name: str, dep: Deployment, ready: int, starting: int, metrics: list[MetricSample], want: int
) -> None:
    reply = ask(dep, ready, starting, metrics=metrics)
    assert reply.desired_replicas == want, (name, reply.reason)
    assert reply.add == 0


def test_scale_down_removes_starting_replicas_first_then_the_newest_ready() -> None:
    reps = replicas(3, 2)
    assert replicas_to_remove(reps, 3) == ["starting-1", "starting-0", "ready-0"]


def test_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="predictive, reactive"):
        make_policy(PolicyConfig(name="psychic"))


def test_the_reply_says_why() -> None:
    reply = ask(deployment(max_replicas=6), 2, metrics=samples(requests_per_s=150.0))
    assert reply.desired_replicas == 6
    assert "requests_per_s 150" in reply.reason and "-> 20" in reply.reason and "rate limit 6" in reply.reason
