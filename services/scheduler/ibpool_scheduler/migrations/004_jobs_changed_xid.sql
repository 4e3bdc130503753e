-- The transaction that last wrote each job row, so a scheduling cycle reads only the rows changed
-- since its previous read (state.LiveJobs) instead of every live job: a row whose `changed_xid` is
-- below a snapshot's xmin was committed (or aborted) before that snapshot was taken. Rows already
-- there get 0 (a constant default: no table rewrite), below every snapshot; the trigger stamps
-- every insert and update from now on.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS changed_xid xid8 NOT NULL DEFAULT '0';
CREATE INDEX IF NOT EXISTS jobs_by_changed_xid ON jobs (changed_xid);

CREATE OR REPLACE FUNCTION jobs_mark_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.changed_xid := pg_current_xact_id();
    RETURN NEW;
END
$$;
CREATE OR REPLACE TRIGGER jobs_mark_changed BEFORE INSERT OR UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_mark_changed();
