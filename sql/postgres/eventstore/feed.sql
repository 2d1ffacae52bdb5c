-- Named queries of runstate/eventstore/postgres.py (feed): the global feed on Postgres (002_event_feed.sql).
-- Not a migration (the file name has no NNN_ version): loaded by name with runstate.sqlfiles.named.

-- name: other_databases_xids
-- The transactions in progress in other databases, read in a statement BEFORE the feed's: one of them
-- still in progress at the feed's snapshot was in progress here too, so every xid of that snapshot that
-- is missing from this list belongs to this database (or started in between: it then holds the read
-- back one poll, never makes it skip). Read in the feed's own statement, after its snapshot, a
-- transaction ending in between looked like one of ours and held back every event after it: a one-shot
-- `runstate events tail` printed nothing. pg_stat_activity gives 32-bit xids.
SELECT COALESCE(array_agg(backend_xid::text::bigint), '{}') FROM pg_stat_activity
WHERE datname <> current_database() AND backend_xid IS NOT NULL;

-- name: feed
-- Only positions below the horizon, which no later commit can precede: the snapshot's xmax, or its
-- oldest in-progress xid not among `other_xids` (other_databases_xids). `%%` is a literal `%`: the query
-- has parameters.
-- The horizon is one scalar, computed once (an InitPlan), so each table is read by an ordered scan of its
-- position index that stops at `limit` rows, and the two are merged: a page costs the same at any table
-- size. (Joined to each table as a row source, the horizon made every page read every row after `after`
-- and sort them: 1M rows per page at 1M events.)
WITH horizon AS MATERIALIZED (
  SELECT LEAST(pg_snapshot_xmax(s), (SELECT min(x) FROM pg_snapshot_xip(s) AS x
    WHERE NOT x::text::bigint %% 4294967296 = ANY(%(other_xids)s::bigint[])))::text::bigint << 20 AS below
  FROM pg_current_snapshot() AS s
)
(SELECT run_id, run_seq, event_id::text AS event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
        event_type, event_data::text AS event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at,
        persisted_at, adapter_version, engine_run_ref::text AS engine_run_ref, position
   FROM run_events
  WHERE position > %(after)s AND position < (SELECT below FROM horizon)
  ORDER BY position LIMIT %(limit)s)
UNION ALL
(SELECT run_id, run_seq, event_id::text AS event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
        event_type, event_data::text AS event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at,
        persisted_at, adapter_version, engine_run_ref::text AS engine_run_ref, position
   FROM run_events_archive
  WHERE position > %(after)s AND position < (SELECT below FROM horizon)
  ORDER BY position LIMIT %(limit)s)
ORDER BY position LIMIT %(limit)s;
