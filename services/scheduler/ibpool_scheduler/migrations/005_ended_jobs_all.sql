-- Every ended job by when it ended (an ended row is never written again, so `updated_at` is its end):
-- what a new leader's fair share starts from (`state.usage_history`, cancelled jobs included) and,
-- through its predicate, what the runtime model learns from (completed, failed, killed). It replaces
-- migration 003's index, which left out cancelled jobs: a new leader's first cycle read the whole
-- table.
CREATE INDEX IF NOT EXISTS jobs_ended_by_end ON jobs (updated_at) WHERE state IN ('completed', 'failed', 'cancelled', 'killed');
DROP INDEX IF EXISTS jobs_learned_by_end;
