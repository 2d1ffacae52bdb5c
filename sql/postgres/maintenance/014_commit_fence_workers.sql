-- The commit fence, per worker session instead of per attempt (replaces 013's function; the trigger
-- that calls it is unchanged).
--
-- A maintenance worker's Spark catalog connections carry `application_name` =
-- 'rsf:<first 8 hex of md5(schema)>:<first 16 hex of md5(worker)>', one session for all the jobs the
-- worker runs, one after another. Such a commit goes through only while a job claimed by that worker
-- (job_queue.claimed_by, set by the claim) holds the table's lock and a live lease: a worker whose
-- claim ran out, or was taken over by another worker, cannot commit. Any other connection (a writer
-- outside maintenance, another schema's worker) is never blocked here.
-- SET search_path FROM CURRENT: the function reads this schema's tables whatever the caller's path.
CREATE OR REPLACE FUNCTION commit_fence() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    tag TEXT := coalesce(current_setting('application_name', true), '');
    prefix TEXT := 'rsf:' || left(md5(current_schema()), 8) || ':';
    worker TEXT;
BEGIN
    IF left(tag, length(prefix)) <> prefix THEN
        RETURN NEW;
    END IF;
    worker := substr(tag, length(prefix) + 1);
    IF NOT EXISTS (
        SELECT 1
        FROM table_locks l
        JOIN job_queue q ON q.job_id = l.holder
        WHERE l.table_key = NEW.table_namespace || '.' || NEW.table_name
          AND l.expires_at > now()
          AND left(md5(q.claimed_by), 16) = worker
          AND q.visible_at > now()
    ) THEN
        RAISE EXCEPTION 'runstate maintenance: worker % no longer holds a claim on table %.%; Iceberg commit refused',
            worker, NEW.table_namespace, NEW.table_name
            USING ERRCODE = 'lock_not_available';
    END IF;
    RETURN NEW;
END
$$;
