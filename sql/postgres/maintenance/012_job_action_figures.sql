-- What each action achieved: the table's figures just before and just after it (data files, bytes,
-- delete files, manifests, canary-scan planning time). '{}' for dry runs and for rows from before 012.
ALTER TABLE job_actions ADD COLUMN before JSONB NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE job_actions ADD COLUMN after JSONB NOT NULL DEFAULT '{}'::jsonb;
