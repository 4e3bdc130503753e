-- Every deployment: `body` is the whole DeploymentRecord (JSON): spec, policy, the scaler's memory, the last decision.
CREATE TABLE IF NOT EXISTS deployments (
    name       text        PRIMARY KEY,
    updated_at timestamptz NOT NULL,
    body       text        NOT NULL
);

-- The next replica number per deployment name; kept after a DELETE, so a deployment created again under
-- the same name never reuses a job id the scheduler already knows.
CREATE TABLE IF NOT EXISTS replica_numbers (
    deployment text   PRIMARY KEY,
    next       bigint NOT NULL
);

-- The replicas alive (submitted and not finished, not cancelled by us): one scheduler job each.
CREATE TABLE IF NOT EXISTS replicas (
    job_id        text        PRIMARY KEY,
    deployment    text        NOT NULL,
    state         text        NOT NULL,
    since         timestamptz NOT NULL,
    submitted_at  timestamptz NOT NULL,
    allocation_id text,
    nodes         text[]      NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS replicas_by_deployment ON replicas (deployment);

-- Load reported per deployment (DeploymentMetricsReported), pruned after `metric_retention_s`.
CREATE TABLE IF NOT EXISTS samples (
    seq        bigserial   PRIMARY KEY,
    deployment text        NOT NULL,
    at         timestamptz NOT NULL,
    body       text        NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_by_deployment ON samples (deployment, at);
