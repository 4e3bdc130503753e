-- A commit that wrote outbox rows wakes the relay, whichever replica of the service committed it:
-- the relay LISTENs on this channel (named from the schema; Postgres delivers a NOTIFY only when its
-- transaction commits, and one per transaction and channel).
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ibpool_outbox_' || left(md5(TG_TABLE_SCHEMA), 16), '');
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
