-- Named queries of runstate/eventstore/pg_snapshots.py: the state snapshots on Postgres.
-- Not a migration (the file name has no NNN_ version): loaded with runstate.sqlfiles.queries.

-- name: write_snapshot
-- One statement (the append's pipeline sends it without waiting for it). The DELETE sees the table as it was
-- before the INSERT: keep the newest keep-1 older snapshots next to the new one.
WITH added AS (
  INSERT INTO run_state_snapshots
    (run_id, seq, kind, encoding, payload, checksum, raw_bytes, stored_bytes, reason)
  VALUES (%(run_id)s, %(seq)s, %(kind)s, %(encoding)s, %(payload)s, %(checksum)s, %(raw)s, %(stored)s,
          %(reason)s)
  ON CONFLICT (run_id, seq) DO NOTHING
  RETURNING 1
), pruned AS (
  DELETE FROM run_state_snapshots WHERE run_id = %(run_id)s AND seq < %(seq)s AND seq NOT IN (
    SELECT seq FROM run_state_snapshots WHERE run_id = %(run_id)s AND seq < %(seq)s
    ORDER BY seq DESC LIMIT %(older)s)
)
SELECT count(*) FROM added;

-- name: snapshots
-- Newest first: the newest one that decodes wins (choose_valid skips corrupt ones).
SELECT run_id, seq, kind, encoding, payload, checksum FROM run_state_snapshots
 WHERE run_id = %s ORDER BY seq DESC;

-- name: projection_snapshots_upto
-- The projection snapshots a fold up to that seq can start from, newest first.
SELECT run_id, seq, kind, encoding, payload, checksum FROM run_state_snapshots
 WHERE run_id = %s AND kind = 'projection' AND seq <= %s ORDER BY seq DESC;

-- name: stored_projection_upto
-- The projector's stored projection, when it does not run past the seq (a better start than a snapshot).
SELECT snapshot_data FROM run_snapshots WHERE run_id = %s AND last_event_seq <= %s;

-- name: lock_last_seq
-- The stream row lock keeps appenders out while checkpoint() snapshots the run's last seq.
SELECT last_seq FROM run_streams WHERE run_id = %s FOR UPDATE;
