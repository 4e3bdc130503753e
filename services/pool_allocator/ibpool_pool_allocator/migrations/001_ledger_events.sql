-- Every ledger event the allocator published, in ledger order; replayed, they rebuild the ledger.
CREATE TABLE IF NOT EXISTS ledger_events (
    version int  NOT NULL,
    seq     int  NOT NULL,
    event_id text NOT NULL,
    body    text NOT NULL,
    PRIMARY KEY (version, seq)
);
