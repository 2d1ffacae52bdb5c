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

-- name: feed_bound
-- The feed's next page of at most `limit` events, counted and bounded without reading a row: how many it
-- holds and its last position (`after` when it is empty). The same horizon as `feed`, and an index-only
-- read of the position indexes. The run history's export reads the rows themselves through Spark's JDBC
-- source (export_rows): every one of them has committed, so that later read sees exactly these.
WITH horizon AS MATERIALIZED (
  SELECT LEAST(pg_snapshot_xmax(s), (SELECT min(x) FROM pg_snapshot_xip(s) AS x
    WHERE NOT x::text::bigint %% 4294967296 = ANY(%(other_xids)s::bigint[])))::text::bigint << 20 AS below
  FROM pg_current_snapshot() AS s
), page AS (
  (SELECT position FROM run_events
    WHERE position > %(after)s AND position < (SELECT below FROM horizon) ORDER BY position LIMIT %(limit)s)
  UNION ALL
  (SELECT position FROM run_events_archive
    WHERE position > %(after)s AND position < (SELECT below FROM horizon) ORDER BY position LIMIT %(limit)s)
  ORDER BY position LIMIT %(limit)s
)
SELECT count(*), COALESCE(max(position), %(after)s) FROM page;

-- name: export_rows
-- Every event, live or archived, with its columns as the run history keeps them: the source table of
-- Spark's JDBC reads (runstate/eventstore/lake/source.py), which add `position` bounds of their own that
-- Postgres pushes into both arms, so each reads a range of a position index. No parameters: Spark's
-- JDBC source cannot bind any. The key is the text the store's API gives (pg_sql.key_text: 32 bytes are
-- a hex key; a trailing 0xFF marks a 32-byte text key), JSON is jsonb's text, and the timestamps are
-- epoch microseconds, which Spark turns into timestamps exactly (a JDBC timestamp goes through
-- java.sql.Timestamp's Julian calendar before 1582).
SELECT run_id, run_seq, event_id::text AS event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
       event_type, event_data::text AS event_data,
       CASE WHEN octet_length(idempotency_key) = 32 THEN encode(idempotency_key, 'hex')
            WHEN octet_length(idempotency_key) = 33 AND get_byte(idempotency_key, 32) = 255
              THEN convert_from(substring(idempotency_key FROM 1 FOR 32), 'UTF8')
            ELSE convert_from(idempotency_key, 'UTF8') END AS idempotency_key,
       caused_by_signal_id::text AS caused_by_signal_id, parent_event_id::text AS parent_event_id,
       (extract(epoch FROM emitted_at) * 1000000)::bigint AS emitted_at_us,
       (extract(epoch FROM persisted_at) * 1000000)::bigint AS persisted_at_us,
       adapter_version, engine_run_ref::text AS engine_run_ref, position
  FROM (SELECT run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version, event_type,
               event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at, persisted_at,
               adapter_version, engine_run_ref, position
          FROM run_events
        UNION ALL
        SELECT run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version, event_type,
               event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at, persisted_at,
               adapter_version, engine_run_ref, position
          FROM run_events_archive) AS events;
