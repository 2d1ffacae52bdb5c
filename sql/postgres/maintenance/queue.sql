-- The maintenance queue's named queries (Snowpack data model, 010_maintenance.sql): submit, fenced
-- claims, heartbeats, completions, cancels and reads. JobQueue (runstate/maintenance/queue.py) is the
-- only user; runstate.sqlfiles loads them by name.
--
-- Locking rule: every change of an in-flight job's status (claim, complete, cancel, sweep) first locks
-- its job_queue row, so whoever holds that row lock can read the job's status without locking the jobs
-- row. The ordered picks read job_queue alone: with a join, stale statistics (a queue filled faster
-- than autovacuum analyzes it) make the planner sort the whole queue on every claim instead of reading
-- the first entries of the partial index. attempt_count is nullable in the seed (DEFAULT 0): NULL reads
-- as 0 everywhere.

-- name: submit_lock
-- Serialises submits for one table, so "one active job per table" holds under concurrency.
SELECT pg_advisory_xact_lock(%s);

-- name: table_is_cached
SELECT 1 FROM table_cache_entries WHERE database_name = %s AND table_name = %s;

-- name: active_job_id
SELECT job_id FROM jobs WHERE database_name = %s AND table_name = %s AND status IN ('pending', 'running') AND deleted_at IS NULL ORDER BY submitted_at LIMIT 1;

-- name: insert_job
INSERT INTO jobs (job_id, database_name, table_name, actions, dry_run, status, submitted_at, options) VALUES (%s, %s, %s, %s, %s, 'pending', now(), %s);

-- name: enqueue_job
INSERT INTO job_queue (job_id, enqueued_at, visible_at, attempt_count) VALUES (%s, now(), now(), 0);

-- name: dequeue_with_claim
-- The claim. It takes the oldest expired lease through idx_job_queue_claimed (retries first, so new
-- work cannot starve them) and, only when there is none, the oldest never-claimed row through
-- idx_job_queue_ready: two index probes, never a sort of the queue. SKIP LOCKED: a row another claim,
-- completion or cancel holds is passed over, never waited on. NO KEY UPDATE, not UPDATE: it must not
-- block the FK KEY SHARE lock that inserting job_actions takes. A picked row that must not run again
-- (its lease used the last attempt, or its job was cancelled while the worker died) is not claimed;
-- claim() then runs sweep_stale_claims, which finishes it, and looks again.
WITH lease_expired AS (
    SELECT q.job_id
    FROM job_queue q
    WHERE q.claimed_at IS NOT NULL AND q.visible_at <= now()
    ORDER BY q.visible_at
    LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED
),
ready AS (
    SELECT q.job_id
    FROM job_queue q
    WHERE NOT EXISTS (SELECT 1 FROM lease_expired)
      AND q.claimed_at IS NULL AND q.visible_at <= now()
    ORDER BY q.visible_at
    LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED
),
picked AS (
    SELECT job_id FROM lease_expired UNION ALL SELECT job_id FROM ready
),
claimed AS (
    UPDATE job_queue q SET
        claimed_at = now(), claimed_by = %(worker)s, attempt_id = %(attempt_id)s,
        attempt_count = COALESCE(q.attempt_count, 0) + 1,
        visible_at = now() + make_interval(secs => %(lease_seconds)s)
    FROM picked p JOIN jobs j ON j.job_id = p.job_id
    WHERE q.job_id = p.job_id AND COALESCE(q.attempt_count, 0) < %(max_attempts)s
      AND j.status IN ('pending', 'running')
    RETURNING q.job_id, q.attempt_count
),
-- The status recheck is against the newest row version: a cancel that slipped in is never overwritten.
started AS (
    UPDATE jobs j SET status = 'running', started_at = now(), attempt_id = %(attempt_id)s
    FROM claimed c WHERE j.job_id = c.job_id AND j.status IN ('pending', 'running')
    RETURNING j.job_id, j.database_name, j.table_name, j.actions, j.dry_run, j.options, c.attempt_count
),
-- The claim commits without waiting for its WAL flush: a claim lost in a crash loses nothing (the job is
-- still queued, and the fence refuses the worker that held it), and the worker's next durable write (the
-- table lock, an action, the completion) flushes it anyway. That halves the fsyncs per job.
no_flush_wait AS (
    SELECT set_config('synchronous_commit', 'off', true)
)
SELECT s.job_id, s.database_name, s.table_name, s.actions, s.dry_run, s.options, s.attempt_count,
       (SELECT count(*) FROM picked) AS picked
FROM no_flush_wait LEFT JOIN started s ON true;

-- name: sweep_stale_claims
-- Expired leases with attempts left go back to pending (fence cleared); exhausted ones fail (or end
-- cancelled if they were being cancelled); a job cancelled while running whose worker is gone ends
-- cancelled.
WITH 
exhausted AS (
    SELECT q.job_id, q.attempt_count, q.claimed_by
    FROM job_queue q
    WHERE q.claimed_at IS NOT NULL AND q.visible_at <= now()
      AND COALESCE(q.attempt_count, 0) >= %(max_attempts)s
    FOR NO KEY UPDATE SKIP LOCKED
),
exhausted_dequeued AS (
    DELETE FROM job_queue q USING exhausted x WHERE q.job_id = x.job_id
),
exhausted_finished AS (
    UPDATE jobs j SET
        status = CASE WHEN j.status = 'cancelled' THEN 'cancelled' ELSE 'failed' END,
        completed_at = now(),
        error = CASE WHEN j.status = 'cancelled' THEN j.error ELSE format(
            'job %%s on %%s.%%s failed: gave up after %%s attempts (max_attempts=%%s);'
            ' the lease of the last attempt'
            ' (worker %%s) expired before the job completed',
            j.job_id, j.database_name, j.table_name, x.attempt_count, %(max_attempts)s, x.claimed_by) END
    FROM exhausted x WHERE j.job_id = x.job_id AND j.status IN ('pending', 'running', 'cancelled')
    RETURNING j.job_id
),
picked AS (
    SELECT q.job_id
    FROM job_queue q
    WHERE q.claimed_at IS NOT NULL AND q.visible_at <= now()
      AND COALESCE(q.attempt_count, 0) < %(max_attempts)s
    FOR NO KEY UPDATE SKIP LOCKED
),

picked_jobs AS (
    SELECT j.job_id, j.status FROM jobs j JOIN picked p ON p.job_id = j.job_id
),
cancelled_dequeued AS (
    DELETE FROM job_queue q USING picked_jobs p WHERE q.job_id = p.job_id AND p.status = 'cancelled'
),
cancelled_finished AS (
    UPDATE jobs j SET completed_at = now()
    FROM picked_jobs p WHERE j.job_id = p.job_id AND p.status = 'cancelled' AND j.completed_at IS NULL
    RETURNING j.job_id
),
requeued AS (
    UPDATE job_queue q SET claimed_at = NULL, claimed_by = NULL, attempt_id = NULL
    FROM picked_jobs p WHERE q.job_id = p.job_id AND p.status IN ('pending', 'running')
    RETURNING q.job_id
),
reset AS (
    UPDATE jobs j SET status = 'pending', attempt_id = NULL
    FROM requeued r WHERE j.job_id = r.job_id AND j.status IN ('pending', 'running')
    RETURNING j.job_id
)
SELECT (SELECT count(*) FROM exhausted_finished) + (SELECT count(*) FROM cancelled_finished)
     + (SELECT count(*) FROM reset);

-- name: any_stale_claim
-- Whether sweep_stale_claims has anything to look at: a claim whose lease has expired.
SELECT EXISTS (SELECT 1 FROM job_queue WHERE claimed_at IS NOT NULL AND visible_at <= now());

-- name: claim_holders
-- The workers holding a live lease, among those whose name starts with the prefix.
SELECT DISTINCT claimed_by FROM job_queue
WHERE claimed_at IS NOT NULL AND visible_at > now() AND starts_with(claimed_by, %(prefix)s);

-- name: expire_leases_of
-- Ends the leases of workers known dead now, so the next claim takes their jobs over at once instead of
-- when the leases run out. The claim's usual rules apply then (attempts left, cancels); a worker wrongly
-- named here is only fenced out, never run twice beside its successor.
UPDATE job_queue SET visible_at = now()
WHERE claimed_at IS NOT NULL AND visible_at > now() AND claimed_by = ANY(%(workers)s)
RETURNING job_id;

-- name: heartbeat
-- The fence: same attempt and a lease that has not run out.
UPDATE job_queue SET visible_at = now() + make_interval(secs => %(lease_seconds)s) WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s AND visible_at > now();

-- name: complete
WITH fenced AS (
    DELETE FROM job_queue
    WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s AND visible_at > now()
    RETURNING job_id
)
UPDATE jobs j SET status = %(status)s, completed_at = now(), error = %(error)s
FROM fenced f WHERE j.job_id = f.job_id AND j.attempt_id = %(attempt_id)s
RETURNING j.job_id;

-- name: completed_by_attempt
SELECT 1 FROM jobs j WHERE j.job_id = %(job_id)s AND j.attempt_id = %(attempt_id)s AND j.status = %(status)s AND j.completed_at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM job_queue q WHERE q.job_id = j.job_id);

-- name: record_action
-- FOR SHARE: a concurrent re-claim (which updates the row) is waited for and then rechecked, so an
-- action can never be recorded under a fence that was replaced meanwhile. One row per action per attempt.
INSERT INTO job_actions (job_id, action, success, message, error, elapsed_seconds, before, after)
SELECT q.job_id, %(action)s, %(success)s, %(message)s, %(error)s, %(elapsed_seconds)s, %(before)s, %(after)s
FROM job_queue q
WHERE q.job_id = %(job_id)s AND q.attempt_id = %(attempt_id)s AND q.visible_at > now()
  AND NOT EXISTS (
      SELECT 1 FROM job_actions a
      WHERE a.job_id = q.job_id AND a.action = %(action)s AND a.created_at >= q.claimed_at)
FOR SHARE OF q
RETURNING id;

-- name: fence_holds
SELECT 1 FROM job_queue WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s AND visible_at > now();

-- name: cancel_status
SELECT status FROM jobs WHERE job_id = %s;

-- name: lock_queue_row
SELECT visible_at > now() AND claimed_at IS NOT NULL FROM job_queue WHERE job_id = %s FOR UPDATE;

-- name: lock_job_row
SELECT status, completed_at FROM jobs WHERE job_id = %s FOR UPDATE;

-- name: request_cancel
UPDATE jobs SET status = 'cancelled' WHERE job_id = %s;

-- name: dequeue
DELETE FROM job_queue WHERE job_id = %s;

-- name: cancel_now
UPDATE jobs SET status = 'cancelled', completed_at = now() WHERE job_id = %s;

-- name: soft_delete
UPDATE jobs SET deleted_at = now() WHERE job_id = %s AND deleted_at IS NULL;

-- name: get_job
SELECT j.job_id, j.database_name, j.table_name, j.actions, j.dry_run, j.status, j.submitted_at, j.started_at, j.completed_at, j.error, j.attempt_id, j.deleted_at, j.options, q.attempt_count, q.claimed_by, q.visible_at FROM jobs j LEFT JOIN job_queue q ON q.job_id = j.job_id WHERE j.job_id = %s;

-- name: list_live_jobs
SELECT j.job_id, j.database_name, j.table_name, j.actions, j.dry_run, j.status, j.submitted_at, j.started_at, j.completed_at, j.error, j.attempt_id, j.deleted_at, j.options, j.attempt_count, j.claimed_by, j.visible_at FROM live_jobs j WHERE (%(status)s::text IS NULL OR j.status = %(status)s) AND (%(database)s::text IS NULL OR (j.database_name = %(database)s AND j.table_name = %(table)s)) ORDER BY j.submitted_at DESC LIMIT %(limit)s;

-- name: last_cadence_job
-- The table's newest live job that counts against the orchestrator's cadence: a job whose actions all
-- apply delete files (%(apply_deletes)s) does not.
SELECT j.job_id, j.database_name, j.table_name, j.actions, j.dry_run, j.status, j.submitted_at, j.started_at, j.completed_at, j.error, j.attempt_id, j.deleted_at, j.options, j.attempt_count, j.claimed_by, j.visible_at FROM live_jobs j WHERE j.database_name = %(database)s AND j.table_name = %(table)s AND NOT (j.actions <@ %(apply_deletes)s::text[]) ORDER BY j.submitted_at DESC LIMIT 1;

-- name: list_all_jobs
SELECT j.job_id, j.database_name, j.table_name, j.actions, j.dry_run, j.status, j.submitted_at, j.started_at, j.completed_at, j.error, j.attempt_id, j.deleted_at, j.options, q.attempt_count, q.claimed_by, q.visible_at FROM jobs j LEFT JOIN job_queue q ON q.job_id = j.job_id WHERE (%(status)s::text IS NULL OR j.status = %(status)s) AND (%(database)s::text IS NULL OR (j.database_name = %(database)s AND j.table_name = %(table)s)) ORDER BY j.submitted_at DESC LIMIT %(limit)s;

-- name: job_actions
SELECT id, job_id, action, success, message, error, elapsed_seconds, created_at, before, after FROM job_actions WHERE job_id = %s ORDER BY id;

-- name: queue_depth
SELECT count(*) FILTER (WHERE visible_at <= now()), count(*) FROM job_queue;

-- name: last_action
SELECT max(a.created_at) FROM job_actions a JOIN jobs j ON j.job_id = a.job_id WHERE j.database_name = %s AND j.table_name = %s AND a.action = %s AND a.success AND NOT j.dry_run;
