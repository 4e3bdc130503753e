"""The scheduler's learned runtime model against real NATS and Postgres: it warms up from the job
history a previous scheduler left, learns from jobs that end while it runs (trained in the
background), a submitted job shows the prediction the cycle planned with, and a restarted
scheduler serves a model again from the history alone."""

from __future__ import annotations

import datetime as dt
from typing import Any

from ibpool_core.sched import records as jobs
from ibpool_core.sched.records import JobRecord
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.store import Store
from ibpool_scheduler import state as sched_state
from tests.integration.helpers import eventually
from tests.integration.test_scheduler import call, job_id, job_state, pool_of, running_scheduler, until_leading

SEEDED = 200
RUN = 6
MODEL = {
    "predict_min_train_rows": 100,
    "predict_retrain_every": RUN,
    "predict_sync_interval_s": 0.2,
}


async def seed_history(store: Store, n: int) -> None:
    """`n` ended jobs as a previous scheduler wrote them: tenant "long" ran ~2 h, "short" ~2 min."""
    await store.migrate(sched_state.MIGRATIONS)
    start = dt.datetime.now(dt.UTC) - dt.timedelta(days=2)
    async with store.transaction() as tx:
        for i in range(n):
            tenant = "long" if i % 2 else "short"
            runtime = (7_200.0 if tenant == "long" else 120.0) * (1 + (i % 5) / 10)
            submitted = start + dt.timedelta(minutes=5 * i)
            ended = submitted + dt.timedelta(seconds=runtime)
            job = JobRecord(
                job_id=f"seed-{i:03d}",
                tenant=tenant,
                queue="default",
                submitted_at=submitted,
                queued_at=submitted,
                state="completed" if i % 7 else "failed",
                started_at=submitted,
                finished_at=ended,
                runtime_s=runtime,
            )
            assert await sched_state.insert_job(tx.conn, job, ended)
        queued = JobRecord(job_id="seed-cancelled", tenant="long", queue="default", submitted_at=start, queued_at=start)
        cancelled = jobs.finished(queued, "cancelled", "cancelled through the API", start + dt.timedelta(hours=1))
        assert await sched_state.insert_job(tx.conn, cancelled, start + dt.timedelta(hours=1))


async def model(service: Any) -> dict[str, Any]:
    status, body = await call(service, "GET", "/v1/model")
    assert status == 200, body
    return dict(body)


async def test_ended_jobs_train_a_model_and_a_submitted_job_shows_its_prediction(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    await seed_history(store, SEEDED)
    async with pool_of(bus, stack, 1) as pool:
        key = f"sched-{pool.prefix}"
        async with running_scheduler(bus, store, pool.from_seq, leader_key=key, **MODEL) as (service, sched):
            await until_leading(sched, pool.node_ids)

            async def warmed_up() -> bool:
                m = await model(service)
                return m["version"] is not None and m["version"] >= 1

            await eventually(warmed_up, what="a model trained from the job history at start")
            first = await model(service)
            # The cancelled job taught nothing; every seeded completed or failed job did.
            assert first["learned_jobs"] == SEEDED and first["n_samples"] == SEEDED, first
            assert first["serving"] == "model" and first["failed_trainings"] == 0 and first["last_error"] is None

            # Jobs that end while it runs are learned from too (the next training starts after RUN of them).
            ran = [job_id() for _ in range(RUN)]
            for j in ran:
                body = {"id": j, "tenant": "short", "gpus": 1, "workload": {"simulated_runtime_s": 0.2}}
                assert (await call(service, "POST", "/v1/jobs", body))[0] == 201

            async def learned_and_retrained() -> bool:
                m = await model(service)
                return m["learned_jobs"] == SEEDED + RUN and (m["version"] or 0) >= 2

            await eventually(learned_and_retrained, timeout_s=90, what="the ended jobs learned from and a new model")
            for j in ran:
                assert (await job_state(service, j))["state"] == "completed"

            # A new job: the cycle that placed it planned with the model's prediction, and says so.
            j = job_id()
            body = {
                "id": j,
                "tenant": "long",
                "gpus": 1,
                "time_limit_s": 86_400,
                "workload": {"simulated_runtime_s": 30},
            }
            assert (await call(service, "POST", "/v1/jobs", body))[0] == 201

            async def predicted() -> bool:
                return (await job_state(service, j))["predicted_runtime"] is not None

            await eventually(predicted, what="the submitted job showing its predicted runtime")
            p = (await job_state(service, j))["predicted_runtime"]
            assert p["model_version"] >= 1 and 0 < p["p50_s"] <= p["p90_s"] <= 86_400, p
            assert p["p50_s"] > 600, p  # tenant "long" ran ~2 h; nothing it learned says minutes
            await call(service, "DELETE", f"/v1/jobs/{j}")
            learned = (await model(service))["learned_jobs"]

        # A restart: the new instance predicts from the history at once (no job needs to end first).
        async with running_scheduler(bus, store, pool.from_seq, leader_key=key, **MODEL) as (service, sched):

            async def served_again() -> bool:
                m = await model(service)
                return (m["version"] or 0) >= 1

            await eventually(served_again, what="a model trained from the history after a restart")
            again = await model(service)
            assert again["learned_jobs"] == learned == SEEDED + RUN, again  # the cancelled job still not
