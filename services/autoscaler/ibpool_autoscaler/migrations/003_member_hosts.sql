-- A member job may span several hosts (a replica of a tensor-parallel model larger than one node): the
-- hosts it spans and those where the workload of its allocation started; it is up once all of them did.
-- Rows from before keep one host.
ALTER TABLE replicas ADD COLUMN IF NOT EXISTS hosts integer NOT NULL DEFAULT 1;
ALTER TABLE replicas ADD COLUMN IF NOT EXISTS started text[] NOT NULL DEFAULT '{}';
ALTER TABLE elastic_workers ADD COLUMN IF NOT EXISTS hosts integer NOT NULL DEFAULT 1;
ALTER TABLE elastic_workers ADD COLUMN IF NOT EXISTS started text[] NOT NULL DEFAULT '{}';
