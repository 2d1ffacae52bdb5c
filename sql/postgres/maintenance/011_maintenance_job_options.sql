-- The one column beyond the seed's data model (010 is the seed, exactly): per-job action options
-- (rewrite_data_files strategy/sort order/target file size, expire_snapshots older_than/retain_last,
-- remove_orphan_files older_than). They are given at submit time and must reach the worker that
-- claims the job, so they live on the job row. '{}' means "use the configured defaults".
ALTER TABLE jobs ADD COLUMN options JSONB NOT NULL DEFAULT '{}'::jsonb;

-- Same view as 010, with the options column appended (CREATE OR REPLACE VIEW may only add columns at the end).
CREATE OR REPLACE VIEW live_jobs AS
SELECT j.job_id, j.database_name, j.table_name, j.actions, j.dry_run, j.status,
       j.submitted_at, j.started_at, j.completed_at, j.error, j.created_at, j.attempt_id, j.deleted_at,
       q.enqueued_at, q.visible_at, q.claimed_at, q.claimed_by, q.attempt_count,
       j.options
FROM jobs j
LEFT JOIN job_queue q ON q.job_id = j.job_id
WHERE j.deleted_at IS NULL;
