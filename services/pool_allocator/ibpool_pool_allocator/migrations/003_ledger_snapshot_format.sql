-- The ledger format of each snapshot's body (`ibpool_core.pool.ledger.LEDGER_FORMAT`); the
-- snapshots stored before this column were format 1.
ALTER TABLE ledger_snapshots ADD COLUMN IF NOT EXISTS format int NOT NULL DEFAULT 1;
