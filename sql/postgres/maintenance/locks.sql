-- Per-table locks' named queries (table_locks, 010_maintenance.sql). TableLocks
-- (runstate/maintenance/locks.py) is the only user; runstate.sqlfiles loads them by name.
--
-- A job's lock belongs to the job (holder = job_id). An acquire takes a free or expired lock, or extends
-- the holder's own (a lock heartbeat keeps acquired_at); a live lock of another holder is never taken over.

-- name: acquire_lock
INSERT INTO table_locks AS l (table_key, holder, acquired_at, expires_at)
VALUES (%(table_key)s, %(holder)s, now(), now() + make_interval(secs => %(ttl_seconds)s))
ON CONFLICT (table_key) DO UPDATE SET
    holder = EXCLUDED.holder,
    acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > now()
                       THEN l.acquired_at ELSE now() END,
    expires_at = EXCLUDED.expires_at
WHERE l.expires_at <= now() OR l.holder = EXCLUDED.holder
RETURNING holder;

-- name: acquire_for_claim
-- The same, for the claim's job, only while the claim's fence holds (same attempt, live lease).
INSERT INTO table_locks AS l (table_key, holder, acquired_at, expires_at)
SELECT %(table_key)s, q.job_id, now(), now() + make_interval(secs => %(ttl_seconds)s)
FROM job_queue q
WHERE q.job_id = %(job_id)s AND q.attempt_id = %(attempt_id)s AND q.visible_at > now()
ON CONFLICT (table_key) DO UPDATE SET
    holder = EXCLUDED.holder,
    acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > now()
                       THEN l.acquired_at ELSE now() END,
    expires_at = EXCLUDED.expires_at
WHERE l.expires_at <= now() OR l.holder = EXCLUDED.holder
RETURNING holder;

-- name: release_for_claim
-- Released unless another attempt of the job now holds a live fence (then the lock is that attempt's).
DELETE FROM table_locks l
WHERE l.table_key = %(table_key)s AND l.holder = %(job_id)s
  AND NOT EXISTS (
      SELECT 1 FROM job_queue q
      WHERE q.job_id = %(job_id)s AND q.attempt_id IS DISTINCT FROM %(attempt_id)s AND q.visible_at > now());

-- name: release_lock
DELETE FROM table_locks WHERE table_key = %s AND holder = %s;

-- name: sweep_locks
DELETE FROM table_locks WHERE expires_at <= now();

-- name: any_expired_lock
-- Whether sweep_locks has anything to delete.
SELECT EXISTS (SELECT 1 FROM table_locks WHERE expires_at <= now());

-- name: get_lock
SELECT holder, acquired_at, expires_at, expires_at > now() FROM table_locks WHERE table_key = %s;
