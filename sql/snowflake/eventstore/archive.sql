-- Named queries of runstate/eventstore/snowflake.py: archive, restore and import on Snowflake.
-- Not a migration (the file name has no NNN_ version): loaded by name with runstate.sqlfiles.named.
-- Table names are unqualified: the store's connections run in its schema (USE SCHEMA). A tuple of
-- run ids or seqs bound to IN (%s) is expanded by the connector.

-- name: archivable_runs
-- RESTORED_AT IS NULL is tested in SQL: fakesnow hands NULL TIMESTAMP_TZ back as 1970-01-01. A restored
-- run stays live for one archive age after its restore.
SELECT RUN_ID FROM RUN_STREAMS
 WHERE COMPLETED_AT < %s::TIMESTAMP_TZ
   AND (ARCHIVED_AT IS NULL OR UPDATED_AT > ARCHIVED_AT)
   AND (RESTORED_AT IS NULL OR RESTORED_AT < %s::TIMESTAMP_TZ)
 ORDER BY RUN_ID LIMIT %s;

-- name: mark_archived
-- First in the archive's transaction: appenders to these runs now conflict with it, not interleave.
UPDATE RUN_STREAMS SET ARCHIVED_AT = CURRENT_TIMESTAMP() WHERE RUN_ID IN (%s);

-- name: copy_to_archive
-- NOT EXISTS: an event already in the archive is not copied twice (Snowflake enforces no key).
INSERT INTO RUN_EVENTS_ARCHIVE (
  RUN_ID, RUN_SEQ, EVENT_ID, STEP_ID, ENGINE_ATTEMPT_ID, LOGICAL_ATTEMPT_ID, PLAN_VERSION, EVENT_TYPE,
  EVENT_DATA, IDEMPOTENCY_KEY, CAUSED_BY_SIGNAL_ID, PARENT_EVENT_ID, EMITTED_AT, PERSISTED_AT,
  ADAPTER_VERSION, ENGINE_RUN_REF, POSITION
)
SELECT e.RUN_ID, RUN_SEQ, EVENT_ID, STEP_ID, ENGINE_ATTEMPT_ID, LOGICAL_ATTEMPT_ID, PLAN_VERSION, EVENT_TYPE,
       EVENT_DATA, IDEMPOTENCY_KEY, CAUSED_BY_SIGNAL_ID, PARENT_EVENT_ID, EMITTED_AT, PERSISTED_AT,
       ADAPTER_VERSION, ENGINE_RUN_REF, POSITION
FROM RUN_EVENTS e
WHERE e.RUN_ID IN (%s)
  AND NOT EXISTS (SELECT 1 FROM RUN_EVENTS_ARCHIVE a WHERE a.RUN_ID = e.RUN_ID AND a.RUN_SEQ = e.RUN_SEQ);

-- name: delete_archived_events
DELETE FROM RUN_EVENTS WHERE RUN_ID IN (%s);

-- name: delete_snapshots_of_runs
DELETE FROM RUN_STATE_SNAPSHOTS WHERE RUN_ID IN (%s);

-- name: copy_from_archive
INSERT INTO RUN_EVENTS (
  RUN_ID, RUN_SEQ, EVENT_ID, STEP_ID, ENGINE_ATTEMPT_ID, LOGICAL_ATTEMPT_ID, PLAN_VERSION, EVENT_TYPE,
  EVENT_DATA, IDEMPOTENCY_KEY, CAUSED_BY_SIGNAL_ID, PARENT_EVENT_ID, EMITTED_AT, PERSISTED_AT,
  ADAPTER_VERSION, ENGINE_RUN_REF, POSITION
)
SELECT RUN_ID, RUN_SEQ, EVENT_ID, STEP_ID, ENGINE_ATTEMPT_ID, LOGICAL_ATTEMPT_ID, PLAN_VERSION, EVENT_TYPE,
       EVENT_DATA, IDEMPOTENCY_KEY, CAUSED_BY_SIGNAL_ID, PARENT_EVENT_ID, EMITTED_AT, PERSISTED_AT,
       ADAPTER_VERSION, ENGINE_RUN_REF, POSITION
FROM RUN_EVENTS_ARCHIVE WHERE RUN_ID = %s;

-- name: delete_restored_events
DELETE FROM RUN_EVENTS_ARCHIVE WHERE RUN_ID = %s;

-- name: mark_restored
-- RESTORED_AT keeps the run out of the next archive for one archive age (archivable_runs).
UPDATE RUN_STREAMS SET ARCHIVED_AT = NULL, RESTORED_AT = CURRENT_TIMESTAMP() WHERE RUN_ID = %s;

-- name: taken_seqs
-- The import keeps each event's run_seq: find the ones another event already holds.
SELECT RUN_SEQ FROM RUN_EVENTS WHERE RUN_ID = %s AND RUN_SEQ IN (%s);
