CREATE TABLE IF NOT EXISTS nodes (
    node_id       text        PRIMARY KEY,
    hostname      text        NOT NULL,
    backend       text        NOT NULL,
    inventory     text        NOT NULL,
    registered_at timestamptz NOT NULL
);

CREATE TABLE IF NOT EXISTS workloads (
    allocation_id text        PRIMARY KEY,
    job_id        text        NOT NULL,
    node_id       text        NOT NULL REFERENCES nodes (node_id),
    body          text        NOT NULL,
    started_at    timestamptz NOT NULL,
    ends_at       timestamptz,
    exited_at     timestamptz,
    exit_code     int,
    exit_reason   text
);

CREATE INDEX IF NOT EXISTS workloads_running ON workloads (node_id) WHERE exited_at IS NULL;
