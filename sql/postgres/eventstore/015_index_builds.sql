-- When the store last rebuilt each of run_events' run-keyed b-trees, and how many rows the table held then
-- (runstate/eventstore/pg_indexes.py): the archive rebuilds an index once the table has grown by a quarter
-- since, so most of each index stays packed at a cost proportional to the table.
CREATE TABLE IF NOT EXISTS index_builds (
  index_name     TEXT        PRIMARY KEY,
  rows_at_build  BIGINT      NOT NULL,
  built_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
