-- Health and audit history's named queries (health_snapshots, orchestrator_runs; 010_maintenance.sql).
-- History (runstate/maintenance/history.py) is the only user; runstate.sqlfiles loads them by name.
-- The parameter and column names are the fields of HealthSnapshot and OrchestratorRun (models.py);
-- a test checks that they stay in step.

-- name: insert_health
INSERT INTO health_snapshots (
    database_name, table_name, checked_at, needs_maintenance, total_data_files, total_delete_files,
    total_size_bytes, avg_file_size_bytes, small_file_count, small_file_pct, snapshot_count,
    manifest_count, maintenance_enabled, maintenance_cadence_hours, recommended_actions, error,
    total_records, snapshot_id, health_status, hours_since_last_snapshot, oldest_snapshot_age_hours
) VALUES (
    %(database)s, %(table)s, COALESCE(%(checked_at)s, now()), %(needs_maintenance)s, %(total_data_files)s,
    %(total_delete_files)s, %(total_size_bytes)s, %(avg_file_size_bytes)s, %(small_file_count)s,
    %(small_file_pct)s, %(snapshot_count)s, %(manifest_count)s, %(maintenance_enabled)s,
    %(maintenance_cadence_hours)s, %(recommended_actions)s, %(error)s, %(total_records)s, %(snapshot_id)s,
    %(health_status)s, %(hours_since_last_snapshot)s, %(oldest_snapshot_age_hours)s
) RETURNING id;

-- name: latest_health
SELECT id, database_name AS database, table_name AS "table", checked_at, needs_maintenance,
       total_data_files, total_delete_files, total_size_bytes, avg_file_size_bytes, small_file_count,
       small_file_pct, snapshot_count, manifest_count, maintenance_enabled, maintenance_cadence_hours,
       recommended_actions, error, total_records, snapshot_id, health_status, hours_since_last_snapshot,
       oldest_snapshot_age_hours
FROM health_snapshots
WHERE database_name = %s AND table_name = %s
ORDER BY checked_at DESC, id DESC
LIMIT 1;

-- name: prune_health
-- Retention keeps the newest row of every table however old: cached health reads need one.
DELETE FROM health_snapshots h
WHERE h.checked_at < now() - make_interval(secs => %(keep_days)s * 86400)
  AND h.id NOT IN (
      SELECT DISTINCT ON (database_name, table_name) id FROM health_snapshots
      ORDER BY database_name, table_name, checked_at DESC, id DESC);

-- name: insert_orchestrator_run
INSERT INTO orchestrator_runs (
    started_at, completed_at, status, tables_assessed, tables_skipped, tables_healthy, jobs_submitted,
    jobs_completed, jobs_failed, dry_run, error
) VALUES (
    %(started_at)s, %(completed_at)s, %(status)s, %(tables_assessed)s, %(tables_skipped)s,
    %(tables_healthy)s, %(jobs_submitted)s, %(jobs_completed)s, %(jobs_failed)s, %(dry_run)s, %(error)s
) RETURNING id;

-- name: orchestrator_runs
SELECT id, created_at, started_at, completed_at, status, tables_assessed, tables_skipped, tables_healthy,
       jobs_submitted, jobs_completed, jobs_failed, dry_run, error
FROM orchestrator_runs
ORDER BY started_at DESC, id DESC
LIMIT %s;
