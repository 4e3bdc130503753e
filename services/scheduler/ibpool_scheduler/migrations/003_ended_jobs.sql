-- The ended jobs the runtime model learns from, by finish time (an ended row is never written again,
-- so `updated_at` is when it ended): the warm-up reads the newest of them, each sync what ended since.
CREATE INDEX IF NOT EXISTS jobs_learned_by_end ON jobs (updated_at) WHERE state IN ('completed', 'failed', 'killed');
