-- See sql/postgres/004_run_restore.sql: restored runs are not archived again until they age out.
ALTER TABLE RUN_STREAMS ADD COLUMN RESTORED_AT TIMESTAMP_TZ;
