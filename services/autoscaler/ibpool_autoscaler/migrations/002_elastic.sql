-- Batch elasticity. Every elastic training job: `body` is the whole ElasticJobRecord (JSON): what was PUT, the last resize.
CREATE TABLE IF NOT EXISTS elastic_jobs (
    name       text        PRIMARY KEY,
    updated_at timestamptz NOT NULL,
    body       text        NOT NULL
);

-- The next worker number per elastic job name; kept after a DELETE, so a job id is never reused.
CREATE TABLE IF NOT EXISTS worker_numbers (
    elastic_job text   PRIMARY KEY,
    next        bigint NOT NULL
);

-- The workers alive (submitted and not finished, not cancelled by us): one scheduler job each.
CREATE TABLE IF NOT EXISTS elastic_workers (
    job_id        text        PRIMARY KEY,
    elastic_job   text        NOT NULL,
    state         text        NOT NULL,
    since         timestamptz NOT NULL,
    submitted_at  timestamptz NOT NULL,
    allocation_id text,
    nodes         text[]      NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS elastic_workers_by_job ON elastic_workers (elastic_job);

-- Every job the scheduler queued and has not finished (JobQueued .. JobFinished): what it asks for and
-- whether it waits now (queued or requeued, not scheduled since). The waiting ones are the work that
-- elastic jobs make room for.
CREATE TABLE IF NOT EXISTS job_demand (
    job_id   text    PRIMARY KEY,
    gpus     integer NOT NULL,
    priority integer NOT NULL,
    waiting  boolean NOT NULL
);
CREATE INDEX IF NOT EXISTS job_demand_waiting ON job_demand (job_id) WHERE waiting;
