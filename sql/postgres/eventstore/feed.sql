-- Named queries of runstate/eventstore/pg_feed.py: the global feed on Postgres (002_event_feed.sql).
-- Not a migration (the file name has no NNN_ version): loaded with runstate.sqlfiles.queries.

-- name: feed
-- Only positions below the horizon, which no later commit can precede: the snapshot's xmax, or its
-- oldest in-progress xid not known to belong to another database (pg_stat_activity gives 32-bit xids;
-- one that ended meanwhile, or is hidden from this role, still counts: a reader waits one poll, never
-- skips). `%%` is a literal `%`: the query has parameters.
WITH snap AS (
  SELECT pg_current_snapshot() AS s
), horizon AS (
  SELECT LEAST(pg_snapshot_xmax(snap.s), (SELECT min(x) FROM pg_snapshot_xip(snap.s) AS x
    WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname <> current_database()
      AND a.backend_xid::text::bigint = x::text::bigint %% 4294967296)))::text::bigint << 20 AS below
  FROM snap
)
SELECT * FROM (
  SELECT run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
         event_type, event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at,
         persisted_at, adapter_version, engine_run_ref, position
  FROM run_events, horizon
  WHERE position > %(after)s AND position < horizon.below
  UNION ALL
  SELECT run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
         event_type, event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at,
         persisted_at, adapter_version, engine_run_ref, position
  FROM run_events_archive, horizon
  WHERE position > %(after)s AND position < horizon.below
) AS feed ORDER BY position LIMIT %(limit)s;
