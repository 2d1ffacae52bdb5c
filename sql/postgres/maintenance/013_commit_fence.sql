-- The commit fence: a BEFORE UPDATE trigger function for the Iceberg JDBC catalog's `iceberg_tables`,
-- whose conditional UPDATE is the commit of every Iceberg snapshot. The trigger itself is created at
-- runtime (MaintenanceStore.ensure_commit_fence), because Iceberg creates its table on first use.
--
-- A maintenance attempt's Spark catalog connections carry `application_name` =
-- 'rsf:<first 8 hex of md5(schema)>:<attempt_id>'. Such a commit goes through only while that attempt
-- holds its job's fence (same attempt_id, live lease) and the job holds the table's lock. Any other
-- connection (a writer outside maintenance, another schema's attempt) is never blocked here.
-- SET search_path FROM CURRENT: the function reads this schema's tables whatever the caller's path.
CREATE FUNCTION commit_fence() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    tag TEXT := coalesce(current_setting('application_name', true), '');
    prefix TEXT := 'rsf:' || left(md5(current_schema()), 8) || ':';
    attempt TEXT;
BEGIN
    IF left(tag, length(prefix)) <> prefix THEN
        RETURN NEW;
    END IF;
    attempt := substr(tag, length(prefix) + 1);
    IF NOT EXISTS (
        SELECT 1
        FROM table_locks l
        JOIN job_queue q ON q.job_id = l.holder
        WHERE l.table_key = NEW.table_namespace || '.' || NEW.table_name
          AND l.expires_at > now()
          AND q.attempt_id = attempt
          AND q.visible_at > now()
    ) THEN
        RAISE EXCEPTION 'runstate maintenance: attempt % no longer holds table %.%; Iceberg commit refused',
            attempt, NEW.table_namespace, NEW.table_name
            USING ERRCODE = 'lock_not_available';
    END IF;
    RETURN NEW;
END
$$;
