"""The autoscaler's glue without a bus or database: request bodies, metric events, replica jobs, and what one
decision sends."""

from __future__ import annotations

import datetime as dt

import msgspec
import pytest

from ibpool_autoscaler.api import validate
from ibpool_autoscaler.config import AutoscalerConfig
from ibpool_autoscaler.deployments import (
    DeploymentBody,
    DeploymentRecord,
    ReplicaRecord,
    core_deployment,
    decision_messages,
    deployment_view,
    policy_of,
    replica_job,
    sample_of,
)
from ibpool_autoscaler.loadgen import ramp_requests_per_s
from ibpool_core.scale.model import ReactiveConfig, ScalingRequest
from ibpool_core.scale.policies import decide
from ibpool_proto.job import CancelJob, SubmitJob
from ibpool_proto.scale import DeploymentMetricsReported, ScaleDecided
from ibpool_runtime.config import load_config
from ibpool_runtime.http import BadBody

T0 = dt.datetime(2026, 12, 1, 14, 0, tzinfo=dt.UTC)


def body(**fields: object) -> DeploymentBody:
    return msgspec.convert({"tenant": "t", **fields}, DeploymentBody)


def record(b: DeploymentBody, name: str = "chat") -> DeploymentRecord:
    return DeploymentRecord(name=name, body=b, created_at=T0, updated_at=T0)


def test_body_becomes_the_core_deployment_with_every_target() -> None:
    b = body(
        min_replicas=1,
        max_replicas=4,
        gpus=2,
        targets={"requests_per_s": 10, "queue_length": 5, "gpu_utilization": 0.7, "p99_latency_ms": 250},
        policy="predictive",
    )
    d = core_deployment("chat", b)
    assert (d.min_replicas, d.max_replicas, d.shape.gpus) == (1, 4, 2)
    assert d.target_of("requests_per_s") == 10 and d.target_of("queue_length") == 5
    assert d.target_of("gpu_utilization") == 0.7 and d.target_of("p99_latency_s") == 0.25
    assert policy_of(b).name == "predictive"


def test_fraction_replica_shape_and_its_job() -> None:
    b = body(fraction=0.25, memory_mib=20_000)
    d = core_deployment("small", b)
    assert (d.shape.gpus, d.shape.gpu_milli, d.shape.memory_mib) == (0, 250, 20_000)
    spec = replica_job(record(b, "small"), default_runtime_s=3600)
    r = spec.request
    assert (r.kind, r.gpus_per_host, r.milli, r.memory_mib, r.hosts) == ("fraction", 1, 250, 20_000, 1)
    assert spec.workload is not None and spec.workload.simulated_runtime_s == 3600


def test_whole_gpu_replica_job_carries_tenant_queue_priority_and_workload() -> None:
    b = body(gpus=4, queue="inference", priority=50, workload={"command": ["serve", "--port", "8000"]})
    spec = replica_job(record(b), default_runtime_s=3600)
    assert (spec.tenant, spec.queue, spec.priority) == ("t", "inference", 50)
    assert (spec.request.kind, spec.request.gpus_per_host, spec.request.hosts) == ("whole", 4, 1)
    assert spec.workload is not None and spec.workload.command == ["serve", "--port", "8000"]


def test_a_replica_on_several_hosts_is_a_gang_that_must_stay_under_one_leaf() -> None:
    b = body(gpus=8, hosts=2, priority=10)
    d = core_deployment("chat", b)
    assert (d.shape.gpus, d.shape.hosts, d.shape.gpu_equivalent) == (8, 2, 16.0)
    spec = replica_job(record(b, "chat"), default_runtime_s=3600)
    r = spec.request
    assert (r.kind, r.gpus_per_host, r.hosts) == ("gang", 8, 2)
    assert (spec.topology, spec.topology_level, spec.on_member_failure) == ("required", 1, "restart")
    one = replica_job(record(body(gpus=8), "chat"), default_runtime_s=3600)
    assert (one.request.kind, one.request.hosts) == ("whole", 1)


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"min_replicas": 5, "max_replicas": 2}, "$.min_replicas"),
        ({"gpus": 1, "fraction": 0.5}, "$.fraction"),
        ({"fraction": 0.5, "hosts": 2}, "$.hosts"),
        ({"gpus": 1, "memory_mib": 1000}, "$.memory_mib"),
        ({"targets": {}}, "$.targets"),
    ],
)
def test_a_body_that_does_not_add_up_names_its_field(fields: dict[str, object], path: str) -> None:
    with pytest.raises(BadBody) as e:
        validate("chat", body(**fields))
    assert e.value.path == path


def test_msgspec_rejects_bad_values_with_their_path() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"\$\.targets\.gpu_utilization"):
        body(targets={"gpu_utilization": 1.5})
    with pytest.raises(msgspec.ValidationError, match=r"\$\.policy"):
        body(policy="magic")
    with pytest.raises(msgspec.ValidationError, match=r"\$\.hosts"):
        body(gpus=8, hosts=0)
    with pytest.raises(msgspec.ValidationError, match=r"\$\.reactive\.tolerance"):
        body(reactive={"tolerance": "high"})


def test_metric_event_becomes_a_sample_in_seconds() -> None:
    ev = DeploymentMetricsReported(
        source="lb", key="chat", deployment="chat", requests_per_s=12.5, p99_latency_ms=180, occurred_at=T0
    )
    s = sample_of(ev)
    assert (s.at, s.requests_per_s, s.p99_latency_s, s.queue_length, s.gpu_utilization) == (T0, 12.5, 0.18, None, None)


def test_a_scale_up_sends_scale_decided_and_one_submission_per_new_replica() -> None:
    b = body(min_replicas=1, max_replicas=4, targets={"requests_per_s": 10}, reactive={"metric_window_s": 30})
    rec = record(b)
    replicas = [ReplicaRecord(job_id="chat-r1", deployment="chat", state="ready", since=T0, submitted_at=T0)]
    now = T0 + dt.timedelta(minutes=5)
    samples = [
        sample_of(
            DeploymentMetricsReported(
                source="lb",
                key="chat",
                deployment="chat",
                requests_per_s=35.0,
                occurred_at=now - dt.timedelta(seconds=s),
            )
        )
        for s in (20, 10, 0)
    ]
    reply = decide(
        ScalingRequest(
            deployment=core_deployment("chat", b),
            replicas=[r.core() for r in replicas],
            metrics=samples,
            now=now,
            policy=policy_of(b),
        )
    )
    assert reply.desired_replicas == 4 and reply.add == 3
    out = decision_messages(rec, reply, 1, ["chat-r2", "chat-r3", "chat-r4"], "autoscaler-1", 3600)
    decided, *submits = out
    assert isinstance(decided, ScaleDecided)
    assert (decided.current_replicas, decided.target_replicas, decided.reason) == (1, 4, reply.reason)
    assert decided.reason
    assert [type(m) for m in submits] == [SubmitJob] * 3
    assert [m.job_id for m in submits if isinstance(m, SubmitJob)] == ["chat-r2", "chat-r3", "chat-r4"]


def test_a_scale_down_cancels_the_replicas_the_policy_removes() -> None:
    b = body(
        min_replicas=1,
        max_replicas=4,
        targets={"requests_per_s": 10},
        reactive=msgspec.to_builtins(
            ReactiveConfig(scale_down_window_s=1, metric_window_s=5, down_percent=100, down_period_s=1)
        ),
    )
    replicas = [
        ReplicaRecord(
            job_id=f"chat-r{i}", deployment="chat", state="ready", since=T0 + dt.timedelta(seconds=i), submitted_at=T0
        )
        for i in (1, 2, 3)
    ]
    now = T0 + dt.timedelta(minutes=10)
    sample = sample_of(
        DeploymentMetricsReported(source="lb", key="chat", deployment="chat", requests_per_s=4.0, occurred_at=now)
    )
    reply = decide(
        ScalingRequest(
            deployment=core_deployment("chat", b),
            replicas=[r.core() for r in replicas],
            metrics=[sample],
            now=now,
            policy=policy_of(b),
        )
    )
    assert reply.desired_replicas == 1 and reply.add == 0
    out = decision_messages(record(b), reply, 3, [], "autoscaler-1", 3600)
    cancels = [m for m in out if isinstance(m, CancelJob)]
    # The newest ready replicas go first.
    assert sorted(c.job_id for c in cancels) == ["chat-r2", "chat-r3"]
    assert all(c.reason.startswith("scaled down: ") for c in cancels)


def test_an_unchanged_count_sends_nothing() -> None:
    b = body(min_replicas=2, max_replicas=4)
    replicas = [
        ReplicaRecord(job_id=f"chat-r{i}", deployment="chat", state="starting", since=T0, submitted_at=T0)
        for i in (1, 2)
    ]
    reply = decide(
        ScalingRequest(
            deployment=core_deployment("chat", b),
            replicas=[r.core() for r in replicas],
            metrics=[],
            now=T0,
            policy=policy_of(b),
        )
    )
    assert reply.desired_replicas == 2
    assert decision_messages(record(b), reply, 2, [], "a", 1.0) == []


def test_view_counts_starting_and_ready_and_the_last_wanted() -> None:
    rec = record(body())
    replicas = [
        ReplicaRecord(job_id="chat-r1", deployment="chat", state="ready", since=T0, submitted_at=T0),
        ReplicaRecord(job_id="chat-r2", deployment="chat", state="starting", since=T0, submitted_at=T0),
    ]
    view = deployment_view(rec, replicas)
    assert (view.replicas.wanted, view.replicas.starting, view.replicas.ready) == (2, 1, 1)


def test_config_from_env() -> None:
    cfg = load_config(AutoscalerConfig, "autoscaler", env={"IBPOOL_AUTOSCALER_INTERVAL_S": "0.5"})
    assert cfg.interval_s == 0.5 and cfg.leader_key == "autoscaler"


@pytest.mark.parametrize(
    ("elapsed", "rps"),
    [(0.0, 5.0), (19.9, 5.0), (30.0, 20.0), (40.0, 35.0), (59.9, 35.0), (60.0, 5.0), (500.0, 5.0)],
)
def test_load_ramp_rises_holds_and_drops(elapsed: float, rps: float) -> None:
    assert ramp_requests_per_s(elapsed, 100.0, base=5.0, peak=35.0) == pytest.approx(rps)
