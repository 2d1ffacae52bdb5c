"""The queue's SQL (Snowpack data model, sql/postgres/maintenance/010_maintenance.sql): submit, fenced claims,
heartbeats, completions, cancels and reads. JobQueue (queue.py) is the only user.

Locking rule: every change of an in-flight job's status (claim, complete, cancel, sweep) first locks
its job_queue row, so whoever holds that row lock can read the job's status without locking the jobs
row. The ordered picks read job_queue alone: with a join, stale statistics (a queue filled faster
than autovacuum analyzes it) make the planner sort the whole queue on every claim instead of reading
the first entries of the partial index.
"""

_JOB_COLUMNS = (
    "j.job_id, j.database_name, j.table_name, j.actions, j.dry_run, j.status, j.submitted_at, j.started_at,"
    " j.completed_at, j.error, j.attempt_id, j.deleted_at, j.options,"
    " q.attempt_count, q.claimed_by, q.visible_at"
)

SUBMIT_LOCK_SQL = "SELECT pg_advisory_xact_lock(%s)"
TABLE_IS_CACHED_SQL = "SELECT 1 FROM table_cache_entries WHERE database_name = %s AND table_name = %s"
ACTIVE_JOB_ID_SQL = (
    "SELECT job_id FROM jobs WHERE database_name = %s AND table_name = %s"
    " AND status IN ('pending', 'running') AND deleted_at IS NULL ORDER BY submitted_at LIMIT 1"
)
INSERT_JOB_SQL = (
    "INSERT INTO jobs (job_id, database_name, table_name, actions, dry_run, status, submitted_at, options)"
    " VALUES (%s, %s, %s, %s, %s, 'pending', now(), %s)"
)
ENQUEUE_JOB_SQL = (
    "INSERT INTO job_queue (job_id, enqueued_at, visible_at, attempt_count) VALUES (%s, now(), now(), 0)"
)
# first entries of the partial index.

# attempt_count is nullable in the seed (DEFAULT 0): NULL reads as 0 everywhere.

# Claimed rows whose last lease ran out with no attempts left: the job fails (or, if it was being
# cancelled, ends cancelled). Part of the sweep, which a claim also runs when it meets such a row.
_EXHAUSTED_CTES = """
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
)"""

# `picked` (job_id) rows whose queue row this statement holds locked: a job cancelled while running whose
# worker is gone (its lease ran out) is finished as cancelled instead of being handed out again.
_FINISH_CANCELLED_CTES = """
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
)"""

# The dequeue_with_claim CTE. It takes the oldest expired lease through idx_job_queue_claimed
# (retries first, so new work cannot starve them) and, only when there is none,
# the oldest never-claimed row through idx_job_queue_ready: two index probes, never a sort of the queue.
# SKIP LOCKED: a row another claim, completion or cancel holds is passed over, never waited on.
# NO KEY UPDATE, not UPDATE: it must not block the FK KEY SHARE lock that inserting job_actions takes.
# A picked row that must not run again (its lease used the last attempt, or its job was cancelled while
# the worker died) is not claimed; claim() then runs SWEEP_STALE_CLAIMS_SQL, which finishes it, and looks
# again. That keeps the hot statement small.
DEQUEUE_WITH_CLAIM_SQL = """
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
FROM no_flush_wait LEFT JOIN started s ON true
"""

# Expired leases with attempts left go back to pending (fence cleared); exhausted ones fail; a job
# cancelled while running whose worker is gone ends cancelled.
SWEEP_STALE_CLAIMS_SQL = f"""
WITH {_EXHAUSTED_CTES},
picked AS (
    SELECT q.job_id
    FROM job_queue q
    WHERE q.claimed_at IS NOT NULL AND q.visible_at <= now()
      AND COALESCE(q.attempt_count, 0) < %(max_attempts)s
    FOR NO KEY UPDATE SKIP LOCKED
),
{_FINISH_CANCELLED_CTES},
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
     + (SELECT count(*) FROM reset)
"""

# The fence: same attempt and a lease that has not run out.
HEARTBEAT_SQL = (
    "UPDATE job_queue SET visible_at = now() + make_interval(secs => %(lease_seconds)s)"
    " WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s AND visible_at > now()"
)
COMPLETE_SQL = """
WITH fenced AS (
    DELETE FROM job_queue
    WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s AND visible_at > now()
    RETURNING job_id
)
UPDATE jobs j SET status = %(status)s, completed_at = now(), error = %(error)s
FROM fenced f WHERE j.job_id = f.job_id AND j.attempt_id = %(attempt_id)s
RETURNING j.job_id
"""
COMPLETED_BY_ATTEMPT_SQL = (
    "SELECT 1 FROM jobs j WHERE j.job_id = %(job_id)s AND j.attempt_id = %(attempt_id)s"
    " AND j.status = %(status)s"
    " AND j.completed_at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM job_queue q WHERE q.job_id = j.job_id)"
)
# FOR SHARE: a concurrent re-claim (which updates the row) is waited for and then rechecked, so an action
# can never be recorded under a fence that was replaced meanwhile. One row per action per attempt.
RECORD_ACTION_SQL = """
INSERT INTO job_actions (job_id, action, success, message, error, elapsed_seconds, before, after)
SELECT q.job_id, %(action)s, %(success)s, %(message)s, %(error)s, %(elapsed_seconds)s, %(before)s, %(after)s
FROM job_queue q
WHERE q.job_id = %(job_id)s AND q.attempt_id = %(attempt_id)s AND q.visible_at > now()
  AND NOT EXISTS (
      SELECT 1 FROM job_actions a
      WHERE a.job_id = q.job_id AND a.action = %(action)s AND a.created_at >= q.claimed_at)
FOR SHARE OF q
RETURNING id
"""
FENCE_HOLDS_SQL = (
    "SELECT 1 FROM job_queue WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s AND visible_at > now()"
)
CANCEL_STATUS_SQL = "SELECT status FROM jobs WHERE job_id = %s"

LOCK_QUEUE_ROW_SQL = (
    "SELECT visible_at > now() AND claimed_at IS NOT NULL FROM job_queue WHERE job_id = %s FOR UPDATE"
)
LOCK_JOB_ROW_SQL = "SELECT status, completed_at FROM jobs WHERE job_id = %s FOR UPDATE"
REQUEST_CANCEL_SQL = "UPDATE jobs SET status = 'cancelled' WHERE job_id = %s"
DEQUEUE_SQL = "DELETE FROM job_queue WHERE job_id = %s"
CANCEL_NOW_SQL = "UPDATE jobs SET status = 'cancelled', completed_at = now() WHERE job_id = %s"
SOFT_DELETE_SQL = "UPDATE jobs SET deleted_at = now() WHERE job_id = %s AND deleted_at IS NULL"

GET_JOB_SQL = (
    f"SELECT {_JOB_COLUMNS} FROM jobs j LEFT JOIN job_queue q ON q.job_id = j.job_id WHERE j.job_id = %s"
)
_LIST_FILTERS = (
    " WHERE (%(status)s::text IS NULL OR j.status = %(status)s)"
    " AND (%(database)s::text IS NULL OR (j.database_name = %(database)s AND j.table_name = %(table)s))"
)
LIST_LIVE_JOBS_SQL = (
    "SELECT j.job_id, j.database_name, j.table_name, j.actions, j.dry_run, j.status, j.submitted_at,"
    " j.started_at, j.completed_at, j.error, j.attempt_id, j.deleted_at, j.options, j.attempt_count,"
    " j.claimed_by, j.visible_at"
    " FROM live_jobs j" + _LIST_FILTERS + " ORDER BY j.submitted_at DESC LIMIT %(limit)s"
)
LIST_ALL_JOBS_SQL = (
    f"SELECT {_JOB_COLUMNS} FROM jobs j LEFT JOIN job_queue q ON q.job_id = j.job_id"
    + _LIST_FILTERS
    + " ORDER BY j.submitted_at DESC LIMIT %(limit)s"
)
JOB_ACTIONS_SQL = (
    "SELECT id, job_id, action, success, message, error, elapsed_seconds, created_at, before, after"
    " FROM job_actions WHERE job_id = %s ORDER BY id"
)
QUEUE_DEPTH_SQL = "SELECT count(*) FILTER (WHERE visible_at <= now()), count(*) FROM job_queue"
LAST_ACTION_SQL = (
    "SELECT max(a.created_at) FROM job_actions a JOIN jobs j ON j.job_id = a.job_id"
    " WHERE j.database_name = %s AND j.table_name = %s AND a.action = %s AND a.success AND NOT j.dry_run"
)
