CREATE TABLE IF NOT EXISTS topology_versions (
    version      int         PRIMARY KEY,
    content_hash text        NOT NULL,
    body         bytea       NOT NULL,
    hosts        int         NOT NULL,
    switches     int         NOT NULL,
    links        int         NOT NULL,
    created_at   timestamptz NOT NULL
);

CREATE TABLE IF NOT EXISTS link_health (
    link_id    text        PRIMARY KEY,
    state      text        NOT NULL,
    body       text        NOT NULL,
    updated_at timestamptz NOT NULL
);

CREATE TABLE IF NOT EXISTS counter_samples (
    link_id text        NOT NULL,
    at      timestamptz NOT NULL,
    up      boolean     NOT NULL,
    sample  text        NOT NULL,
    PRIMARY KEY (link_id, at)
);
