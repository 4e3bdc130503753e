-- The dataset registry (PUT /v1/datasets/{name}): which nodes hold a copy of a dataset, for
-- data-locality placement; merged with the `datasets` of the scheduler's config.
CREATE TABLE IF NOT EXISTS datasets (
    name       text        PRIMARY KEY,
    nodes      text[]      NOT NULL,
    updated_at timestamptz NOT NULL
);
