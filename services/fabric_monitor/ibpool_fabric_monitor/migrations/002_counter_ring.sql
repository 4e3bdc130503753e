-- Counter samples kept in a ring per link: `slot` is the poll's place in the window
-- (`state.sample_slot`), so a poll overwrites its slot instead of inserting a row and a prune
-- deleting over the whole table (which, at 300,000 links, ran a window function over every row of
-- every link on every poll). Rows per link never exceed the window. The old table held history
-- only (nothing reads it back); it is dropped.
CREATE TABLE IF NOT EXISTS counter_ring (
    link_id text        NOT NULL,
    slot    int         NOT NULL,
    at      timestamptz NOT NULL,
    up      boolean     NOT NULL,
    sample  text        NOT NULL,
    PRIMARY KEY (link_id, slot)
);
DROP TABLE IF EXISTS counter_samples;
