"""The scheduler's runtime model adapter without a bus or database: what it learns from, its
per-job prediction cache, background trainings (a failing one keeps the previous model), the
Gittins history it shares, and the cycle planning with its predictions."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import threading
from collections.abc import Sequence

import msgspec
import numpy as np
import pytest
import structlog
from prometheus_client import CollectorRegistry

from ibpool_core.clock import FixedClock
from ibpool_core.pool import allocate as al
from ibpool_core.pool.ledger import Ledger
from ibpool_core.sched.cycle import CycleConfig
from ibpool_core.sched.pool_cycle import core_job, plan_cycle
from ibpool_core.sched.queueing import make_policy
from ibpool_core.sched.records import JobRecord, RuntimePrediction
from ibpool_core.sched.runtime import RuntimeEstimate
from ibpool_predict.model import BoostParams, TrainedModel, TrainingSet, train_boosted_quantiles
from ibpool_proto.node import GpuInfo, NodeRegistered
from ibpool_runtime.clock import SystemClock
from ibpool_runtime.config import ConfigError
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit
from ibpool_scheduler.config import SchedulerConfig
from ibpool_scheduler.predictor import PredictorSettings, RuntimePredictor, learned_runtime
from ibpool_scheduler.service import Scheduler

T0 = dt.datetime(2026, 12, 1, 14, 0, tzinfo=dt.UTC)


def record(job_id: str, *, state: str = "queued", tenant: str = "a", gpus: int = 1, **kw: object) -> JobRecord:
    fields: dict[str, object] = {
        "job_id": job_id,
        "tenant": tenant,
        "queue": "default",
        "gpus_per_host": gpus,
        "submitted_at": T0,
        "queued_at": T0,
        "state": state,
        **kw,
    }
    return msgspec.convert(fields, JobRecord, from_attributes=False, strict=False)


def ended(job_id: str, runtime_s: float, *, at: float = 0.0, state: str = "completed", **kw: object) -> JobRecord:
    submitted = T0 + dt.timedelta(seconds=at)
    return msgspec.structs.replace(
        record(job_id, state=state, **kw),
        submitted_at=submitted,
        started_at=submitted,
        finished_at=submitted + dt.timedelta(seconds=runtime_s),
        runtime_s=runtime_s,
    )


class ConstantModel:
    """Predicts the same p50/p90 for every row (the quantile trees are not what is tested here)."""

    def __init__(self, p50: float, p90: float) -> None:
        self.p50, self.p90 = p50, p90

    def predict_log(self, tenants: Sequence[str], rows: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
        n = len(tenants)
        return np.full(n, math.log(self.p50)), np.full(n, math.log(self.p90))


class ScriptedTrainer:
    """Each training takes the next answer: a (p50, p90) model, or an exception to raise."""

    def __init__(self, *answers: tuple[float, float] | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, data: TrainingSet) -> TrainedModel:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return TrainedModel(model=ConstantModel(*answer), metrics={"holdout_mae_s": 1.0, "n_fit": len(data.rows)})


def predictor(
    trainer: object = None, registry: CollectorRegistry | None = None, **settings: object
) -> RuntimePredictor:
    s = msgspec.structs.replace(PredictorSettings(retrain_every=5, min_train_rows=5, batch_interval_s=0), **settings)
    return RuntimePredictor(s, clock=FixedClock(T0), trainer=trainer, registry=registry)  # type: ignore[arg-type]


def pair(e: RuntimeEstimate) -> tuple[float, float]:
    return e.p50, e.p90


@pytest.mark.parametrize(
    ("name", "job", "want"),
    [
        ("completed: its runtime", ended("c", 120.0), 120.0),
        ("failed after running: how long it held the GPUs", ended("f", 30.0, state="failed"), 30.0),
        (
            "failed after too many requeues: no run ended",
            msgspec.structs.replace(ended("r", 0.0, state="failed"), started_at=None, runtime_s=0.0),
            None,
        ),
        (
            "killed at its limit: start to kill",
            msgspec.structs.replace(ended("k", 600.0, state="killed", time_limit_s=600.0), runtime_s=0.0),
            600.0,
        ),
        ("cancelled while running: never", ended("x", 50.0, state="cancelled"), None),
        ("cancelled while queued: never", record("q", state="cancelled"), None),
    ],
)
def test_what_an_ended_job_teaches(name: str, job: JobRecord, want: float | None) -> None:
    assert learned_runtime(job) == want, name


def test_observe_skips_what_teaches_nothing_and_feeds_the_gittins_history() -> None:
    p = predictor(ScriptedTrainer())
    policy = make_policy("gittins-learned")
    p.attach([make_policy("fifo"), policy])
    assert policy.history is p.history  # type: ignore[attr-defined]
    assert p.observe(ended("a1", 100.0)) and p.observe(ended("a2", 300.0, state="failed"))
    assert not p.observe(ended("a3", 50.0, state="cancelled"))
    assert p.learned == 2 and p.history.version == 2
    assert p.history.samples("a", 1) == (100.0, 300.0)  # too few for (a, 1 GPU) and a: everything


def test_before_any_model_the_tenant_median_serves_and_is_kept_while_the_job_waits() -> None:
    p = predictor(ScriptedTrainer())
    for i, runtime in enumerate((100.0, 200.0, 300.0)):
        p.observe(ended(f"a{i}", runtime, at=i))
    waiting = record("w", submitted_at=T0 + dt.timedelta(hours=1))
    first = p.predictions([waiting, record("run", state="running")])
    assert list(first) == ["w"] and first["w"].p50 == 200.0  # only queued jobs are predicted
    p.observe(ended("a9", 10_000.0, at=9))  # the median moves, the kept answer does not
    assert p.predictions([waiting])["w"] == first["w"]
    assert p.stamped(waiting).predicted == RuntimePrediction(
        p50_s=first["w"].p50, p90_s=first["w"].p90, model_version=0
    )
    p.predictions([])  # the job left the queue: forgotten
    assert p.stamped(waiting) is waiting


def test_a_new_model_version_recomputes_the_kept_predictions() -> None:
    registry = CollectorRegistry()
    p = predictor(ScriptedTrainer((50.0, 80.0), (500.0, 800.0)), registry)
    waiting = record("w", time_limit_s=700.0)
    for i in range(5):
        p.observe(ended(f"a{i}", 100.0, at=i))
    assert p.maybe_retrain(wait=True) and p.version == 1
    assert pair(p.predictions([waiting])["w"]) == pytest.approx((50.0, 80.0))
    assert registry.get_sample_value("ibpool_scheduler_model_version") == 1.0
    assert not p.maybe_retrain(wait=True)  # nothing learned since: no training
    for i in range(5):
        p.observe(ended(f"b{i}", 100.0, at=10 + i))
    assert p.maybe_retrain(wait=True) and p.version == 2
    # Recomputed with version 2, capped at the job's limit (it is stopped there).
    assert pair(p.predictions([waiting])["w"]) == pytest.approx((500.0, 700.0))
    assert p.stamped(waiting).predicted == RuntimePrediction(p50_s=500.0, p90_s=700.0, model_version=2)
    status = p.status()
    assert status.version == 2 and status.serving == "model" and status.n_samples == 10
    assert status.metrics["holdout_mae_s"] == 1.0 and status.trained_at == T0


def test_at_most_one_model_call_per_batch_interval() -> None:
    p = predictor(ScriptedTrainer((50.0, 80.0)), batch_interval_s=3_600.0)
    for i in range(5):
        p.observe(ended(f"a{i}", 100.0, at=i))
    old, new = record("old"), record("new")
    assert list(p.predictions([old])) == ["old"]  # the first call is made
    assert p.maybe_retrain(wait=True) and p.version == 1
    # Within the interval: the new job waits for the next call, the old one keeps version 0's answer.
    got = p.predictions([old, new])
    assert list(got) == ["old"] and got["old"].p50 == 100.0
    assert p.stamped(new) is new and p.stamped(old).predicted.model_version == 0  # type: ignore[union-attr]


def test_a_training_that_raises_keeps_the_previous_model_serving() -> None:
    registry = CollectorRegistry()
    trainer = ScriptedTrainer((50.0, 80.0), RuntimeError("out of memory"))
    p = predictor(trainer, registry)
    for i in range(5):
        p.observe(ended(f"a{i}", 100.0, at=i))
    p.maybe_retrain(wait=True)
    before = p.predictions([record("w")])
    for i in range(5):
        p.observe(ended(f"b{i}", 100.0, at=10 + i))
    assert p.maybe_retrain(wait=True)  # started, and failed on the worker
    assert trainer.calls == 2 and p.version == 1
    assert p.predictions([record("w")]) == before
    status = p.status()
    assert status.version == 1 and status.failed_trainings == 1
    assert status.last_error == "RuntimeError: out of memory"
    assert registry.get_sample_value("ibpool_scheduler_model_trainings_failed_total") == 1.0
    assert registry.get_sample_value("ibpool_scheduler_model_version") == 1.0


def test_a_training_runs_off_the_calling_thread_and_predictions_go_on_meanwhile() -> None:
    release, entered = threading.Event(), threading.Event()
    caller = threading.get_ident()
    threads: list[int] = []

    def slow(data: TrainingSet) -> TrainedModel:
        threads.append(threading.get_ident())
        entered.set()
        assert release.wait(10)
        return TrainedModel(model=ConstantModel(40.0, 90.0), metrics={})

    p = predictor(slow)
    for i in range(5):
        p.observe(ended(f"a{i}", 100.0, at=i))
    assert p.maybe_retrain()  # returns at once
    assert entered.wait(10)
    assert p.predictions([record("w")])["w"].p50 == 100.0 and p.version == 0  # the median, meanwhile
    for i in range(5):
        p.observe(ended(f"b{i}", 100.0, at=10 + i))
    assert not p.maybe_retrain()  # one training at a time
    release.set()
    p.close()  # waits for the running training
    assert threads and threads[0] != caller
    assert p.version == 1 and p.predictions([record("w")])["w"].p50 == pytest.approx(40.0)


def test_the_real_learner_trains_on_one_thread_and_predicts_per_tenant() -> None:
    trainer = ScriptedTrainer()  # unused; the real one below

    def real(data: TrainingSet) -> TrainedModel:
        trainer.calls += 1
        return train_boosted_quantiles(data, BoostParams(max_iter=30, min_samples_leaf=5, threads=1))

    p = predictor(real, min_train_rows=100, retrain_every=100)
    for i in range(160):  # tenant s runs ~60 s, tenant l ~6,000 s
        tenant = "s" if i % 2 else "l"
        p.observe(ended(f"j{i}", (60.0 if tenant == "s" else 6_000.0) * (1 + (i % 7) / 10), at=i * 60.0, tenant=tenant))
    assert p.maybe_retrain(wait=True) and p.version == 1 and trainer.calls == 1
    later = T0 + dt.timedelta(days=1)
    got = p.predictions([record("qs", tenant="s", submitted_at=later), record("ql", tenant="l", submitted_at=later)])
    assert got["qs"].p50 < 200.0 < 2_000.0 < got["ql"].p50
    assert all(e.p50 <= e.p90 for e in got.values())
    assert p.status().metrics["n_fit"] > 0
    p.close()


def test_the_cycle_plans_with_this_cycles_prediction_else_the_recorded_one() -> None:
    job = record("j", time_limit_s=3_600.0)
    assert core_job(job).predicted is None
    stored = msgspec.structs.replace(job, predicted=RuntimePrediction(p50_s=10.0, p90_s=20.0, model_version=3))
    assert core_job(stored).predicted == RuntimeEstimate(p50=10.0, p90=20.0)
    assert core_job(stored, RuntimeEstimate(p50=1.0, p90=2.0)).predicted == RuntimeEstimate(p50=1.0, p90=2.0)


def test_sjf_in_the_cycle_starts_the_job_predicted_shortest() -> None:
    ledger = Ledger()
    gpus = [GpuInfo(index=i, uuid=f"GPU-n1-{i}", model="H100", memory_mib=81_559) for i in range(8)]
    registered = NodeRegistered(
        source="test", key="n1", node_id="n1", hostname="n1", cpu_milli=1, memory_mib=1, gpus=gpus, backend="test"
    )
    al.handle(ledger, registered, T0)
    first, second = record("first", gpus=8), record("second", gpus=8, submitted_at=T0 + dt.timedelta(seconds=1))
    now = T0 + dt.timedelta(seconds=10)

    def started(predictions: dict[str, RuntimeEstimate] | None) -> list[str]:
        plan = plan_cycle(
            ledger, [first, second], now, make_policy("sjf"), CycleConfig(), "leaf", predictions=predictions
        )
        return [p.job_id for p in plan.proposals]

    assert started(None) == ["first"]  # nothing known: submission order
    long, short = RuntimeEstimate(p50=5_000.0, p90=9_000.0), RuntimeEstimate(p50=50.0, p90=90.0)
    assert started({"first": long, "second": short}) == ["second"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("predict_retrain_every", 0),
        ("predict_min_train_rows", -1),
        ("predict_window", 0),
        ("predict_sync_interval_s", 0),
        ("predict_batch_interval_s", -1),
    ],
)
def test_bad_model_settings_stop_the_service_naming_the_field(field: str, value: float) -> None:
    cfg = SchedulerConfig(instance="t", leader_election=False, **{field: value})  # type: ignore[arg-type]
    kit = Kit(name="scheduler", config=cfg, bus=None, store=None, metrics=ServiceMetrics("scheduler"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=field):
        Scheduler(kit, SystemClock())


def test_prediction_off_builds_no_model_and_gittins_learned_shares_the_history_when_on() -> None:
    def scheduler(**over: object) -> Scheduler:
        cfg = SchedulerConfig(instance="t", leader_election=False, policy="gittins-learned", **over)  # type: ignore[arg-type]
        kit = Kit(name="scheduler", config=cfg, bus=None, store=None, metrics=ServiceMetrics("scheduler"))  # type: ignore[arg-type]
        return Scheduler(kit, SystemClock())

    assert scheduler(predict_runtime=False).predictor is None
    on = scheduler()
    assert on.predictor is not None and on.policy.history is on.predictor.history  # type: ignore[attr-defined]
    on.predictor.close()


def test_a_learner_that_cannot_be_loaded_leaves_the_service_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    # `load` runs before the service serves; a broken scikit-learn must not stop the scheduler from
    # starting: the load is tried and logged, trainings then fail and the median fallback predicts.
    tried: list[bool] = []

    def broken() -> None:
        tried.append(True)
        raise ImportError("no module named sklearn.ensemble")

    monkeypatch.setattr("ibpool_scheduler.predictor.load_learner", broken)
    p = predictor(ScriptedTrainer(ImportError("no module named sklearn.ensemble")))
    try:
        with structlog.testing.capture_logs() as logs:
            asyncio.run(p.load())
        assert tried == [True]
        assert [e["event"] for e in logs] == ["the runtime model's learner could not be loaded"]
        for i in range(6):
            p.observe(ended(f"e{i}", 100.0 * (i + 1)))
        p.maybe_retrain(force=True, wait=True)
        assert (p.status().serving, p.estimator.failed_trainings) == ("median", 1)
    finally:
        p.close()
