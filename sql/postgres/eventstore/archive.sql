-- Named queries of runstate/eventstore/postgres.py: archive, restore and import on Postgres.
-- Not a migration (the file name has no NNN_ version): loaded by name with runstate.sqlfiles.named.

-- name: archivable_runs
-- A restored run stays live for one archive age after its restore.
SELECT run_id FROM run_streams
 WHERE completed_at < %(cutoff)s
   AND (archived_at IS NULL OR updated_at > archived_at)
   AND (restored_at IS NULL OR restored_at < %(cutoff)s)
 ORDER BY run_id LIMIT %(limit)s FOR UPDATE;

-- name: archive_events
-- DELETE ... RETURNING feeding the INSERT: an event is in exactly one of the two tables, at any time.
WITH moved AS (
  DELETE FROM run_events WHERE run_id = ANY(%s)
  RETURNING run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
            event_type, event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at,
            persisted_at, adapter_version, engine_run_ref, position
), kept AS (
  INSERT INTO run_events_archive (run_id, run_seq, event_id, step_id, engine_attempt_id,
                                  logical_attempt_id, plan_version, event_type, event_data,
                                  idempotency_key, caused_by_signal_id, parent_event_id, emitted_at,
                                  persisted_at, adapter_version, engine_run_ref, position)
  SELECT run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
         event_type, event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at,
         persisted_at, adapter_version, engine_run_ref, position
  FROM moved
  RETURNING 1
)
SELECT count(*) FROM kept;

-- name: delete_snapshots_of_runs
DELETE FROM run_state_snapshots WHERE run_id = ANY(%s);

-- name: mark_archived
UPDATE run_streams SET archived_at = now() WHERE run_id = ANY(%s);

-- name: restore_events
-- archive_events the other way round, for one run (an array of one run_id).
WITH moved AS (
  DELETE FROM run_events_archive WHERE run_id = ANY(%s)
  RETURNING run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
            event_type, event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at,
            persisted_at, adapter_version, engine_run_ref, position
), kept AS (
  INSERT INTO run_events (run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id,
                          plan_version, event_type, event_data, idempotency_key, caused_by_signal_id,
                          parent_event_id, emitted_at, persisted_at, adapter_version, engine_run_ref,
                          position)
  SELECT run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
         event_type, event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at,
         persisted_at, adapter_version, engine_run_ref, position
  FROM moved
  RETURNING 1
)
SELECT count(*) FROM kept;

-- name: mark_restored
-- restored_at keeps the run out of the next archive for one archive age (archivable_runs).
UPDATE run_streams SET archived_at = NULL, restored_at = now() WHERE run_id = %s;

-- name: taken_seqs
-- The import keeps each event's run_seq: find the ones another event already holds.
SELECT run_seq FROM run_events WHERE run_id = %s AND run_seq = ANY(%s);

-- name: insert_imported
-- append.sql's insert_new without ON CONFLICT: the import probed keys and run_seqs first, so a key
-- inserted by a racing writer is a UniqueViolation (the transaction is retried).
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
RETURNING event_count, (SELECT count(*) FROM inserted);
