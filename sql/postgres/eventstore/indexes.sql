-- Named queries of runstate/eventstore/pg_indexes.py: packing run_events' run-keyed b-trees again.
-- Not a migration (the file name has no NNN_ version): loaded by name with runstate.sqlfiles.named.

-- name: try_lock
-- One compaction per schema at a time; another archive that finds it taken skips its compaction. A
-- session lock: the compaction's own connection holds it until it closes.
SELECT pg_try_advisory_lock(hashtextextended('runstate.compact_indexes.' || current_schema(), 0));

-- name: live_rows
-- run_events' live rows, or each partition's summed: the statistics system counts inserts and deletes as
-- they commit (n_live_tup), where reltuples waits for the next VACUUM or ANALYZE.
-- (pg_partition_tree lists no rows for a plain table: the table itself is its one leaf then.)
WITH leaves AS (
  SELECT relid FROM pg_partition_tree(to_regclass('run_events')) WHERE isleaf
  UNION SELECT oid FROM pg_class WHERE oid = to_regclass('run_events') AND relkind = 'r'
)
SELECT COALESCE(sum(GREATEST(s.n_live_tup, c.reltuples::bigint, 0)), 0)::bigint
  FROM leaves l
  JOIN pg_class c ON c.oid = l.relid
  LEFT JOIN pg_stat_user_tables s ON s.relid = l.relid;

-- name: leftovers
-- The invalid copies that a killed REINDEX INDEX CONCURRENTLY leaves on run_events or its partitions
-- (`<index>_ccnew`, or `<index>_ccold` when it was killed after the swap): every write still maintains
-- them, so they go before anything else. Their names start with their index's, and so with run_events.
SELECT c.relname
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE c.relnamespace = current_schema()::regnamespace AND NOT i.indisvalid
   AND c.relname ~ '^run_events.*_cc(new|old)[0-9]*$';

-- name: rows_at_build
SELECT rows_at_build FROM index_builds WHERE index_name = %s;

-- name: record_build
INSERT INTO index_builds (index_name, rows_at_build) VALUES (%s, %s)
ON CONFLICT (index_name) DO UPDATE SET rows_at_build = EXCLUDED.rows_at_build, built_at = now();

-- name: index_bytes
-- The index's size, its partitions' summed when it is partitioned.
SELECT pg_relation_size(to_regclass(%(index)s))
     + COALESCE((SELECT sum(pg_relation_size(relid)) FROM pg_partition_tree(to_regclass(%(index)s))
                  WHERE isleaf), 0)::bigint;
