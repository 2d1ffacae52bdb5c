-- Named queries of runstate/eventstore/snowflake.py: the store's probe of its backend on Snowflake.
-- Not a migration (the file name has no NNN_ version): loaded by name with runstate.sqlfiles.named.
-- Table names are unqualified: the store's connections run in its schema (USE SCHEMA).

-- name: probe_merge
-- Can MERGE run inside an explicit transaction? It changes nothing (1 = 0) and is rolled back anyway;
-- fakesnow's MERGE emulation fails there (DuckDB refuses its temporary table mid-transaction).
MERGE INTO RUN_STREAMS t USING (SELECT 'probe' AS RUN_ID) s ON t.RUN_ID = s.RUN_ID AND 1 = 0
WHEN NOT MATCHED AND 1 = 0 THEN INSERT (RUN_ID, LAST_SEQ, EVENT_COUNT) VALUES (s.RUN_ID, 0, 0);
