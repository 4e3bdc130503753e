-- Handled event ids older than the inbox retention are deleted (Store.prune_inbox). Rows arrive in
-- handled_at order, so a BRIN index finds the old ones at almost no cost to each insert.
CREATE INDEX IF NOT EXISTS inbox_handled_at ON inbox USING brin (handled_at);
