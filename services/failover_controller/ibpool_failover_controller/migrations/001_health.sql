-- The controller's whole picture (ibpool_core.health.decide.HealthState as JSON), one row.
CREATE TABLE IF NOT EXISTS health_state (
    id         int         PRIMARY KEY CHECK (id = 1),
    body       text        NOT NULL,
    updated_at timestamptz NOT NULL
);

-- Observations that must not be lost (registrations, link and job events, allocations), taken in
-- by the consumers in their inbox transaction and handed to the next decision in arrival order.
CREATE TABLE IF NOT EXISTS pending_observations (
    seq  bigserial PRIMARY KEY,
    body text      NOT NULL
);

-- Every verdict event published, newest last (GET /health/verdicts).
CREATE TABLE IF NOT EXISTS verdicts (
    seq         bigserial   PRIMARY KEY,
    event_id    text        NOT NULL,
    type        text        NOT NULL,
    key         text        NOT NULL,
    occurred_at timestamptz NOT NULL,
    body        text        NOT NULL
);

-- Link id -> the hosts that depend on it, from the newest topology the fabric monitor published.
CREATE TABLE IF NOT EXISTS link_targets (
    id       int  PRIMARY KEY CHECK (id = 1),
    version  int  NOT NULL,
    body     text NOT NULL
);
