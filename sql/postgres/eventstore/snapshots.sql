-- Named queries of runstate/eventstore/postgres.py: the state snapshots on Postgres.
-- Not a migration (the file name has no NNN_ version): loaded by name with runstate.sqlfiles.named.

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
-- Newest first: the newest one that decodes wins (choose_valid skips corrupt ones). A fold up to a seq
-- asks for the projection snapshots it can start from: `upto` bounds the seq, and `kind`, when not NULL,
-- the kind.
SELECT run_id, seq, kind, encoding, payload, checksum FROM run_state_snapshots
 WHERE run_id = %(run_id)s AND seq <= %(upto)s AND (%(kind)s::text IS NULL OR kind = %(kind)s)
 ORDER BY seq DESC;
