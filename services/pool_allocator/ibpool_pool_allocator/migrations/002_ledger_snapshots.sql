-- The ledger as it stood at one row of ledger_events (the newest snapshot only). The allocator
-- starts from it and reads the rows after it; the rows before it are deleted, so neither the log
-- nor the time to load it grows with the cluster's age.
CREATE TABLE IF NOT EXISTS ledger_snapshots (
    version  int         NOT NULL,
    seq      int         NOT NULL,
    event_id text        NOT NULL,
    body     bytea       NOT NULL,
    taken_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (version, seq)
);
