-- Named queries of runstate/eventstore/postgres.py: the store's own checks of its schema on Postgres.
-- Not a migration (the file name has no NNN_ version): loaded by name with runstate.sqlfiles.named.

-- name: count_partitions
-- The partition count is fixed when run_events is first created: ensure_schema checks it matches.
SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass(%s);

-- name: current_database
-- The database the store lives in: with the schema, the store's name as the lake's tables record their
-- owner (runstate/eventstore/lake/tables.py).
SELECT current_database();
