-- Named queries of runstate/eventstore/postgres.py: the event store's append on Postgres.
-- Not a migration (the file name has no NNN_ version): loaded by name with runstate.sqlfiles.named.
-- The arrays go as binary parameters (%(x)b), packed by runstate/eventstore/pg_arrays.py.
-- The position packs the transaction id with the row's place in the batch (002_event_feed.sql).

-- name: append_events
-- The common case (005_one_statement_append.sql): the stream row's upsert takes the run's row lock and
-- gives the seq the batch follows; the check, last, aborts the whole statement when a guess of the
-- client was wrong (RSK02), and with it the snapshot the client sends behind it in the same
-- transaction (snapshots.sql's write_snapshot). An all-NULL column goes as a NULL array, which unnest pads.
-- `added` counts the whole batch; when its first `offset` events went ahead (insert_head), the arrays
-- hold the rest.
WITH stream AS (
  INSERT INTO run_streams AS s (run_id, last_seq, event_count, first_event_at, started_at, completed_at)
  VALUES (%(run_id)s, %(added)s, %(added)s, %(first_event_at)s, %(started_at)s, %(completed_at)s)
  ON CONFLICT (run_id) DO UPDATE
     SET last_seq = s.last_seq + EXCLUDED.last_seq,
         event_count = s.event_count + EXCLUDED.event_count,
         first_event_at = COALESCE(s.first_event_at, EXCLUDED.first_event_at),
         started_at = COALESCE(s.started_at, EXCLUDED.started_at),
         completed_at = COALESCE(s.completed_at, EXCLUDED.completed_at),
         updated_at = now()
  RETURNING s.last_seq - %(added)s AS before, s.event_count - %(added)s AS count_before,
            s.archived_at IS NOT NULL AS archived
), tx AS (
  SELECT pg_current_xact_id()::text::bigint << 20 AS base
), inserted AS (
  INSERT INTO run_events (run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id,
                          plan_version, event_type, event_data, idempotency_key, caused_by_signal_id,
                          parent_event_id, emitted_at, adapter_version, engine_run_ref, position)
  SELECT %(run_id)s, stream.before + %(offset)s + u.ord, u.event_id, u.step_id, u.engine_attempt_id,
         u.logical_attempt_id, u.plan_version, u.event_type, u.data::jsonb, u.key, u.caused_by,
         u.parent, u.emitted_at, u.adapter_version, u.ref::jsonb, tx.base | (%(offset)s + u.ord)
  FROM stream, tx, unnest(
    %(event_id)b::uuid[], %(step_id)b::text[], %(engine_attempt_id)b::text[],
    %(logical_attempt_id)b::text[], %(plan_version)b::text[], %(event_type)b::text[], %(data)b::text[],
    %(key)b::bytea[], %(caused_by)b::uuid[], %(parent)b::uuid[], %(emitted_at)b::timestamptz[],
    %(adapter_version)b::text[], %(ref)b::text[]
  ) WITH ORDINALITY AS u(event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
                         event_type, data, key, caused_by, parent, emitted_at, adapter_version, ref, ord)
)
SELECT runstate_check_append(before, count_before, archived, %(expected)s, %(added)s, %(every)s,
                             %(signal_waiting)s, %(snapshot_seq)s, %(snapshot_count_before)s),
       count_before
FROM stream;

-- name: insert_head
-- The first part of a large batch, sent while the client still validates the rest: it takes the run's
-- stream row lock (as lock_stream does) and inserts after its last_seq; append_events inserts the rest
-- in the same transaction, with `offset` the head's length. A key already stored aborts the
-- transaction (a unique violation): the append then runs the slow way.
WITH stream AS (
  INSERT INTO run_streams AS s (run_id) VALUES (%(run_id)s)
  ON CONFLICT (run_id) DO UPDATE SET updated_at = s.updated_at
  RETURNING s.last_seq
)
INSERT INTO run_events (run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id,
                        plan_version, event_type, event_data, idempotency_key, caused_by_signal_id,
                        parent_event_id, emitted_at, adapter_version, engine_run_ref, position)
SELECT %(run_id)s, stream.last_seq + u.ord, u.event_id, u.step_id, u.engine_attempt_id,
       u.logical_attempt_id, u.plan_version, u.event_type, u.data::jsonb, u.key, u.caused_by, u.parent,
       u.emitted_at, u.adapter_version, u.ref::jsonb, (pg_current_xact_id()::text::bigint << 20) | u.ord
FROM stream, unnest(
  %(event_id)b::uuid[], %(step_id)b::text[], %(engine_attempt_id)b::text[],
  %(logical_attempt_id)b::text[], %(plan_version)b::text[], %(event_type)b::text[], %(data)b::text[],
  %(key)b::bytea[], %(caused_by)b::uuid[], %(parent)b::uuid[], %(emitted_at)b::timestamptz[],
  %(adapter_version)b::text[], %(ref)b::text[]
) WITH ORDINALITY AS u(event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
                       event_type, data, key, caused_by, parent, emitted_at, adapter_version, ref, ord);

-- name: lock_stream
-- The upsert takes the row lock that serialises this run's writers (and only them).
INSERT INTO run_streams (run_id) VALUES (%s)
ON CONFLICT (run_id) DO UPDATE SET updated_at = run_streams.updated_at
RETURNING last_seq, event_count, archived_at IS NOT NULL;

-- name: find_stream
-- lock_stream for a run that may not exist (checkpoint, restore): locks the row, makes none.
SELECT last_seq, event_count, archived_at IS NOT NULL FROM run_streams WHERE run_id = %s FOR UPDATE;

-- name: insert_new
-- The slow way's insert: a key already stored is skipped by ON CONFLICT, and the short count aborts
-- the transaction (RSK01, runstate_expect_inserted) so that the append retries with the key probe.
WITH rows AS (
  SELECT * FROM unnest(
    %(seq)b::bigint[], %(event_id)b::uuid[], %(step_id)b::text[], %(engine_attempt_id)b::text[],
    %(logical_attempt_id)b::text[], %(plan_version)b::text[], %(event_type)b::text[], %(data)b::text[],
    %(key)b::bytea[], %(caused_by)b::uuid[], %(parent)b::uuid[], %(emitted_at)b::timestamptz[],
    %(adapter_version)b::text[], %(ref)b::text[]
  ) WITH ORDINALITY AS u(seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
                         event_type, data, key, caused_by, parent, emitted_at, adapter_version, ref, ord)
), tx AS (
  SELECT pg_current_xact_id()::text::bigint << 20 AS base
), inserted AS (
  INSERT INTO run_events (run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id,
                          plan_version, event_type, event_data, idempotency_key, caused_by_signal_id,
                          parent_event_id, emitted_at, adapter_version, engine_run_ref, position)
  SELECT %(run_id)s, seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
         event_type, data::jsonb, key, caused_by, parent, emitted_at, adapter_version, ref::jsonb,
         tx.base | ord
  FROM rows, tx
  ON CONFLICT (run_id, idempotency_key) DO NOTHING
  RETURNING 1
)
UPDATE run_streams
   SET last_seq = GREATEST(last_seq, %(last_seq)s),
       event_count = event_count + (SELECT count(*) FROM inserted),
       first_event_at = COALESCE(first_event_at, %(first_event_at)s),
       started_at = COALESCE(started_at, %(started_at)s),
       completed_at = COALESCE(completed_at, %(completed_at)s),
       updated_at = now()
 WHERE run_id = %(run_id)s
RETURNING event_count, runstate_expect_inserted((SELECT count(*) FROM inserted), %(new)s);

-- name: existing_keys
-- Probe the (run_id, idempotency_key) index once per key: `= ANY(array)` lets the planner scan the
-- whole run and filter, which grows with the run's length.
SELECT e.idempotency_key, e.run_seq FROM unnest(%(keys)b::bytea[]) AS k(key)
  JOIN run_events e ON e.run_id = %(run_id)s AND e.idempotency_key = k.key;

-- name: existing_keys_with_archive
-- existing_keys for an archived run: ON CONFLICT cannot see run_events_archive, so probe it too.
SELECT e.idempotency_key, e.run_seq FROM unnest(%(keys)b::bytea[]) AS k(key)
  JOIN run_events e ON e.run_id = %(run_id)s AND e.idempotency_key = k.key
UNION ALL
SELECT a.idempotency_key, a.run_seq FROM unnest(%(keys)b::bytea[]) AS k(key)
  JOIN run_events_archive a ON a.run_id = %(run_id)s AND a.idempotency_key = k.key;
