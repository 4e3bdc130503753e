-- Handled event ids older than the inbox retention are deleted (Store.prune_inbox). Rows arrive in
-- handled_at order, so a BRIN index finds the old ones at almost no cost to each insert. Once pruning
-- has freed pages that new rows reuse, its ranges widen and a prune reads more of the table: never
-- much more than the scan it would be without an index. Built in the migration's transaction, it
-- blocks inserts into the inbox while it reads the table once.
CREATE INDEX IF NOT EXISTS inbox_handled_at ON inbox USING brin (handled_at);
