-- Every job this scheduler accepted, live or ended (the history runtime prediction learns from).
-- `body` is the whole JobRecord (JSON); the columns beside it are what queries filter on.
CREATE TABLE IF NOT EXISTS jobs (
    job_id       text        PRIMARY KEY,
    seq          bigserial   NOT NULL,
    queue        text        NOT NULL,
    tenant       text        NOT NULL,
    state        text        NOT NULL,
    submitted_at timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    body         text        NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_live ON jobs (seq) WHERE state IN ('queued', 'proposed', 'scheduled', 'running');
CREATE INDEX IF NOT EXISTS jobs_by_seq ON jobs (seq);

-- The highest leader term that committed a scheduling cycle; a deposed leader's lower term is refused.
CREATE TABLE IF NOT EXISTS leader_fence (
    id   int    PRIMARY KEY CHECK (id = 1),
    term bigint NOT NULL
);
