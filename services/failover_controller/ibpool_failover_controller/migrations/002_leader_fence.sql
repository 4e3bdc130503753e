-- The highest leader term that committed a decision; a deposed leader's lower term is refused.
CREATE TABLE IF NOT EXISTS leader_fence (
    id   int    PRIMARY KEY CHECK (id = 1),
    term bigint NOT NULL
);
