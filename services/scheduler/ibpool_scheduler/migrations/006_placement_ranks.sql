-- A job's placement names its nodes in rank order `ranks` (it was `hosts`, the name a job's host
-- count has everywhere else). Stored bodies are renamed in place; a body without a placement, or
-- already renamed, is left as it is.
UPDATE jobs
SET body = jsonb_set(body::jsonb #- '{placement,hosts}', '{placement,ranks}', body::jsonb -> 'placement' -> 'hosts')::text
WHERE jsonb_typeof(body::jsonb -> 'placement') = 'object' AND (body::jsonb -> 'placement') ? 'hosts';
