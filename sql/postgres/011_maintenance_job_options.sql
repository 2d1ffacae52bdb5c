-- The one column beyond the seed's data model (010 is the seed, exactly): per-job action options
-- (rewrite_data_files strategy/sort order/target file size, expire_snapshots older_than/retain_last,
-- remove_orphan_files older_than). They are given at submit time and must reach the worker that
-- claims the job, so they live on the job row. '{}' means "use the configured defaults".
ALTER TABLE jobs ADD COLUMN options JSONB NOT NULL DEFAULT '{}'::jsonb;
