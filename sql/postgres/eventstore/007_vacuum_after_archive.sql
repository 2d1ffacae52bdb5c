-- The daily archive deletes about 1 % of run_events (runs of 100 days ago). With Postgres's defaults those
-- rows stayed dead in the table and in its five indexes: autovacuum waits until 20 % of a table is dead
-- (50 + 0.2 x rows: 400,050 rows at 2M events, about 20 archives), and a VACUUM that finds dead rows in under
-- 2 % of the pages skips the indexes (INDEX_CLEANUP AUTO), which is where an archive's rows are. So:
-- - vacuum_index_cleanup = on: every VACUUM of run_events removes the dead rows' index entries too;
-- - autovacuum_vacuum_scale_factor = 0.005: autovacuum takes the table once 0.5 % of it is dead (plus the
--   default 50 rows), which is after every archive.
-- Set on each partition when run_events is hash-partitioned (a partitioned table takes no such options).
-- docs/OPERATIONS.md says how to check and change them.
DO $$
DECLARE
  events REGCLASS := format('%I.run_events', current_schema())::regclass;
  leaf REGCLASS;
BEGIN
  FOR leaf IN SELECT relid FROM pg_partition_tree(events) WHERE isleaf  -- no rows for a plain table
              UNION SELECT events FROM pg_class WHERE oid = events AND relkind = 'r' LOOP
    EXECUTE format('ALTER TABLE %s SET (vacuum_index_cleanup = on, autovacuum_vacuum_scale_factor = 0.005)',
                   leaf);
  END LOOP;
END
$$;
