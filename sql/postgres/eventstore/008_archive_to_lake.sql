-- RUNSTATE_ARCHIVE_TO=lake: `archive` drops a run's events from Postgres once the run history in the lake
-- (lake.<namespace>.run_events) has every one of them, and records here that the run lives there:
-- - lake_upto: the run's last seq when it was archived to the lake. Its events up to lake_upto are read
--   back from the lake (fetch, project, resume); any appended later are in run_events as usual.
-- - lake_events: how many events the lake holds of it up to lake_upto: a restore (and a read from the
--   start) that finds fewer refuses rather than bring back a run with holes.
-- Both NULL: nothing of the run is in the lake's keeping (never archived there, or restored since).
ALTER TABLE run_streams ADD COLUMN IF NOT EXISTS lake_upto BIGINT;
ALTER TABLE run_streams ADD COLUMN IF NOT EXISTS lake_events BIGINT;
