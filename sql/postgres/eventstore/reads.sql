-- Named queries of runstate/eventstore/postgres.py: a run's events, run lists and projections on Postgres.
-- Not a migration (the file name has no NNN_ version): loaded by name with runstate.sqlfiles.named.

-- name: fetch_run
-- An archived run is read from run_events_archive, and events appended after the archive are in
-- run_events (an event is in exactly one of the two). Each table is read in run_seq order through its
-- primary key and stops at `limit`: a page of a long run costs the page, not the rest of the run.
(SELECT run_id, run_seq, event_id::text AS event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
        event_type, event_data::text AS event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at,
        persisted_at, adapter_version, engine_run_ref::text AS engine_run_ref, position
   FROM run_events
  WHERE run_id = %(run_id)s AND run_seq > %(after)s AND run_seq <= %(upto)s
  ORDER BY run_seq LIMIT %(limit)s)
UNION ALL
(SELECT run_id, run_seq, event_id::text AS event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
        event_type, event_data::text AS event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at,
        persisted_at, adapter_version, engine_run_ref::text AS engine_run_ref, position
   FROM run_events_archive
  WHERE run_id = %(run_id)s AND run_seq > %(after)s AND run_seq <= %(upto)s
  ORDER BY run_seq LIMIT %(limit)s)
ORDER BY run_seq LIMIT %(limit)s;

-- name: fetch_run_with_lake
-- fetch_run and what the lake keeps of the run (lake_upto, lake_events of run_streams: lake_archive.py) in
-- one round trip: a check of its own cost a fetch of a few events about 150 us more. The page is
-- fetch_run's, each table read in run_seq order and stopping at `limit`; a page without events is one row
-- whose event columns are NULL, so the run's record comes back either way.
WITH page AS (
  (SELECT run_id, run_seq, event_id::text AS event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
          event_type, event_data::text AS event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at,
          persisted_at, adapter_version, engine_run_ref::text AS engine_run_ref, position
     FROM run_events
    WHERE run_id = %(run_id)s AND run_seq > %(after)s AND run_seq <= %(upto)s
    ORDER BY run_seq LIMIT %(limit)s)
  UNION ALL
  (SELECT run_id, run_seq, event_id::text AS event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
          event_type, event_data::text AS event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at,
          persisted_at, adapter_version, engine_run_ref::text AS engine_run_ref, position
     FROM run_events_archive
    WHERE run_id = %(run_id)s AND run_seq > %(after)s AND run_seq <= %(upto)s
    ORDER BY run_seq LIMIT %(limit)s)
  ORDER BY run_seq LIMIT %(limit)s
)
SELECT s.lake_upto, s.lake_events, page.*
  FROM (VALUES (%(run_id)s::text)) AS k(run_id)
  LEFT JOIN run_streams s ON s.run_id = k.run_id
  LEFT JOIN page ON true
 ORDER BY page.run_seq;

-- name: run_ids
SELECT run_id FROM run_streams WHERE run_id > %s ORDER BY run_id LIMIT %s;

-- name: runs_created_at
-- When the store first saw each run (its stream row's creation, on the database's clock): it never
-- changes, so the run history partitions its runs table by it (runstate/eventstore/lake/runs.py).
SELECT run_id, created_at FROM run_streams WHERE run_id = ANY(%s);

-- name: max_seq
-- Live or archived (in Postgres or in the lake): the migration between stores resumes after it.
SELECT GREATEST((SELECT max(run_seq) FROM run_events WHERE run_id = %(run_id)s),
                (SELECT max(run_seq) FROM run_events_archive WHERE run_id = %(run_id)s),
                (SELECT lake_upto FROM run_streams WHERE run_id = %(run_id)s));

-- name: stale_runs
-- An archived run is left out until it is restored or appended to again.
SELECT s.run_id, COALESCE(s.started_at, s.first_event_at), s.last_seq
  FROM run_streams s LEFT JOIN run_snapshots p ON p.run_id = s.run_id
 WHERE s.last_seq > COALESCE(p.last_event_seq, 0)
   AND (s.archived_at IS NULL OR s.updated_at > s.archived_at)
 ORDER BY s.run_id LIMIT %s;

-- name: runs_started_between
-- A run without a RunStarted event started at its first event.
SELECT run_id FROM run_streams
 WHERE COALESCE(started_at, first_event_at) >= %s AND COALESCE(started_at, first_event_at) < %s
 ORDER BY run_id;

-- name: stored_projection
SELECT snapshot_data, version FROM run_snapshots WHERE run_id = %s;

-- name: insert_projection
-- The first projection of a run; a racing projector that inserted first wins (no row: re-read).
INSERT INTO run_snapshots (run_id, status, last_event_seq, snapshot_data, started_at, completed_at, version)
VALUES (%(run_id)s, %(status)s, %(seq)s, %(data)s::jsonb, %(started)s, %(completed)s, 1)
ON CONFLICT (run_id) DO NOTHING;

-- name: update_projection
-- Compare-and-set on version: no row when another projector won (the caller re-reads).
UPDATE run_snapshots
   SET status = %(status)s, last_event_seq = %(seq)s, snapshot_data = %(data)s::jsonb,
       started_at = %(started)s, completed_at = %(completed)s, projected_at = now(),
       version = version + 1
 WHERE run_id = %(run_id)s AND version = %(version)s;
