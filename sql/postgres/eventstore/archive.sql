-- Named queries of runstate/eventstore/pg_archive.py: archive, restore and import on Postgres.
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

-- name: lake_archivable_runs
-- archivable_runs for RUNSTATE_ARCHIVE_TO=lake: only runs whose every event in Postgres is at or below the
-- position the lake has reached (the export has them all; the feed never adds an event below a position
-- it returned, so none can come later), after `after` in run_id order (a run whose read-back failed is
-- passed over, not met again), with the seq up to which the lake keeps the run already (0: nothing). The
-- stream row lock keeps appends, restores and other archives out until the transaction ends.
SELECT s.run_id, COALESCE(s.lake_upto, 0) FROM run_streams s
 WHERE s.completed_at < %(cutoff)s
   AND s.run_id > %(after)s
   AND (s.archived_at IS NULL OR s.updated_at > s.archived_at)
   AND (s.restored_at IS NULL OR s.restored_at < %(cutoff)s)
   AND NOT EXISTS (SELECT 1 FROM run_events e WHERE e.run_id = s.run_id AND e.position > %(position)s)
   AND NOT EXISTS (SELECT 1 FROM run_events_archive a WHERE a.run_id = s.run_id AND a.position > %(position)s)
 ORDER BY s.run_id LIMIT %(limit)s FOR UPDATE OF s;

-- name: lake_archive_rows
-- Every row Postgres holds of the runs about to leave for the lake (both tables), locked: the rows the
-- archive compares with what it reads back from the lake, and then deletes (drop_into_lake), in one
-- transaction. The columns are fetch_run's.
WITH live AS (
  SELECT run_id, run_seq, event_id::text AS event_id, step_id, engine_attempt_id, logical_attempt_id,
         plan_version, event_type, event_data::text AS event_data, idempotency_key, caused_by_signal_id,
         parent_event_id, emitted_at, persisted_at, adapter_version, engine_run_ref::text AS engine_run_ref,
         position
    FROM run_events WHERE run_id = ANY(%(runs)s) FOR UPDATE
), kept AS (
  SELECT run_id, run_seq, event_id::text AS event_id, step_id, engine_attempt_id, logical_attempt_id,
         plan_version, event_type, event_data::text AS event_data, idempotency_key, caused_by_signal_id,
         parent_event_id, emitted_at, persisted_at, adapter_version, engine_run_ref::text AS engine_run_ref,
         position
    FROM run_events_archive WHERE run_id = ANY(%(runs)s) FOR UPDATE
)
SELECT * FROM live UNION ALL SELECT * FROM kept ORDER BY run_id, run_seq;

-- name: lake_held_back_runs
-- The runs old enough to archive that the lake does not have whole yet: (run_id, its highest position).
SELECT s.run_id, GREATEST((SELECT max(position) FROM run_events e WHERE e.run_id = s.run_id),
                          (SELECT max(position) FROM run_events_archive a WHERE a.run_id = s.run_id))
  FROM run_streams s
 WHERE s.completed_at < %(cutoff)s
   AND (s.archived_at IS NULL OR s.updated_at > s.archived_at)
   AND (s.restored_at IS NULL OR s.restored_at < %(cutoff)s)
   AND (EXISTS (SELECT 1 FROM run_events e WHERE e.run_id = s.run_id AND e.position > %(position)s)
        OR EXISTS (SELECT 1 FROM run_events_archive a WHERE a.run_id = s.run_id AND a.position > %(position)s))
 ORDER BY s.run_id;

-- name: drop_into_lake
-- The events of runs whose rows the archive read back from the lake leave Postgres (both tables), and each
-- stream records how far the lake keeps the run and how many events that is, in the same statement: all
-- of it, or none. One row per run: how many of its rows were deleted (the archive compares it with the
-- rows it verified, and rolls everything back on a difference).
WITH live AS (
  DELETE FROM run_events WHERE run_id = ANY(%(runs)s) RETURNING run_id
), kept AS (
  DELETE FROM run_events_archive WHERE run_id = ANY(%(runs)s) RETURNING run_id
), gone AS (
  SELECT run_id, count(*) AS n FROM (SELECT run_id FROM live UNION ALL SELECT run_id FROM kept) g
  GROUP BY run_id
), marked AS (
  UPDATE run_streams s
     SET archived_at = now(), lake_upto = s.last_seq,
         lake_events = COALESCE(s.lake_events, 0) + COALESCE(gone.n, 0)
    FROM unnest(%(runs)s::text[]) AS r(run_id) LEFT JOIN gone ON gone.run_id = r.run_id
   WHERE s.run_id = r.run_id
  RETURNING s.run_id
)
SELECT r.run_id, COALESCE(gone.n, 0)::bigint
  FROM unnest(%(runs)s::text[]) AS r(run_id) LEFT JOIN gone ON gone.run_id = r.run_id;

-- name: lake_record
-- (lake_upto, lake_events) of a run archived to the lake; no row, or NULLs, when it is not.
SELECT lake_upto, lake_events FROM run_streams WHERE run_id = %s;

-- name: restore_from_lake
-- The run's events read back from the lake, inserted exactly as they were (seq, id, persisted_at and
-- feed position too: the lake has them already, and the export never reads below its position again).
-- ON CONFLICT DO NOTHING: a row already there (a late event kept live) stays as it is.
WITH rows AS (
  SELECT * FROM unnest(
    %(seq)b::bigint[], %(event_id)b::uuid[], %(step_id)b::text[], %(engine_attempt_id)b::text[],
    %(logical_attempt_id)b::text[], %(plan_version)b::text[], %(event_type)b::text[], %(data)b::text[],
    %(key)b::bytea[], %(caused_by)b::uuid[], %(parent)b::uuid[], %(emitted_at)b::timestamptz[],
    %(persisted_at)b::timestamptz[], %(adapter_version)b::text[], %(ref)b::text[], %(position)b::bigint[]
  ) AS u(seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version, event_type, data,
         key, caused_by, parent, emitted_at, persisted_at, adapter_version, ref, position)
), inserted AS (
  INSERT INTO run_events (run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id,
                          plan_version, event_type, event_data, idempotency_key, caused_by_signal_id,
                          parent_event_id, emitted_at, persisted_at, adapter_version, engine_run_ref,
                          position)
  SELECT %(run_id)s, seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
         event_type, data::jsonb, key, caused_by, parent, emitted_at, persisted_at, adapter_version,
         ref::jsonb, position
  FROM rows
  ON CONFLICT DO NOTHING
  RETURNING 1
)
SELECT count(*) FROM inserted;

-- name: mark_restored_from_lake
UPDATE run_streams
   SET archived_at = NULL, restored_at = now(), lake_upto = NULL, lake_events = NULL
 WHERE run_id = %s;
