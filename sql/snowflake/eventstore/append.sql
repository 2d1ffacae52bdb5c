-- Named queries of runstate/eventstore/snowflake.py: the event store's append on Snowflake.
-- Not a migration (the file name has no NNN_ version): loaded by name with runstate.sqlfiles.named.
-- Table names are unqualified: the store's connections run in its schema (USE SCHEMA, runstate.datastore),
-- as the migrations do.

-- name: stream_exists
SELECT COUNT(*) FROM RUN_STREAMS WHERE RUN_ID = %s;

-- name: create_stream
-- In its own statement before the append transaction: a racing creator fails here (and is retried),
-- never at the append's COMMIT.
MERGE INTO RUN_STREAMS t USING (SELECT %s AS RUN_ID) s ON t.RUN_ID = s.RUN_ID
WHEN NOT MATCHED THEN INSERT (RUN_ID, LAST_SEQ, EVENT_COUNT) VALUES (s.RUN_ID, 0, 0);

-- name: touch_stream
-- The no-op write that serialises the run's appenders: Snowflake holds the table's DML lock to COMMIT;
-- DuckDB (fakesnow) fails the second concurrent writer of the row at once.
UPDATE RUN_STREAMS SET LAST_SEQ = LAST_SEQ WHERE RUN_ID = %s;

-- name: read_stream
-- ARCHIVED_AT is tested in SQL: fakesnow hands NULL TIMESTAMP_TZ values back as 1970-01-01.
SELECT LAST_SEQ, EVENT_COUNT, ARCHIVED_AT IS NOT NULL FROM RUN_STREAMS WHERE RUN_ID = %s;

-- name: existing_keys
-- The connector expands the tuple of keys bound to IN (%s); at most 1000 keys per statement.
SELECT IDEMPOTENCY_KEY, RUN_SEQ FROM RUN_EVENTS WHERE RUN_ID = %s AND IDEMPOTENCY_KEY IN (%s);

-- name: existing_archived_keys
-- An archived run's keys may be in RUN_EVENTS_ARCHIVE, which the MERGE does not look at.
SELECT IDEMPOTENCY_KEY, RUN_SEQ FROM RUN_EVENTS_ARCHIVE WHERE RUN_ID = %s AND IDEMPOTENCY_KEY IN (%s);

-- name: merge_events
-- One statement per chunk of a batch. {rows} is the one piece composed at run time: a `(%s, ..)` group
-- of 17 placeholders per row of the chunk (sf_sql.values_rows), since the row count varies; the values
-- are bound. column1..column17 are typed in the SELECT: PARSE_JSON in a SELECT, never inside VALUES.
MERGE INTO RUN_EVENTS t USING (
  SELECT column1 AS RUN_ID, column2 AS RUN_SEQ, column3 AS EVENT_ID, column4 AS STEP_ID,
         column5 AS ENGINE_ATTEMPT_ID, column6 AS LOGICAL_ATTEMPT_ID, column7 AS PLAN_VERSION,
         column8 AS EVENT_TYPE, PARSE_JSON(column9) AS EVENT_DATA, column10 AS IDEMPOTENCY_KEY,
         column11 AS CAUSED_BY_SIGNAL_ID, column12 AS PARENT_EVENT_ID, column13::TIMESTAMP_TZ AS EMITTED_AT,
         COALESCE(column14::TIMESTAMP_TZ, CURRENT_TIMESTAMP()) AS PERSISTED_AT, column15 AS ADAPTER_VERSION,
         PARSE_JSON(column16) AS ENGINE_RUN_REF, column17 AS POSITION
  FROM VALUES {rows}
) s
ON t.RUN_ID = s.RUN_ID AND t.IDEMPOTENCY_KEY = s.IDEMPOTENCY_KEY
WHEN NOT MATCHED THEN INSERT (
  RUN_ID, RUN_SEQ, EVENT_ID, STEP_ID, ENGINE_ATTEMPT_ID, LOGICAL_ATTEMPT_ID, PLAN_VERSION, EVENT_TYPE,
  EVENT_DATA, IDEMPOTENCY_KEY, CAUSED_BY_SIGNAL_ID, PARENT_EVENT_ID, EMITTED_AT, PERSISTED_AT,
  ADAPTER_VERSION, ENGINE_RUN_REF, POSITION
) VALUES (
  s.RUN_ID, s.RUN_SEQ, s.EVENT_ID, s.STEP_ID, s.ENGINE_ATTEMPT_ID, s.LOGICAL_ATTEMPT_ID, s.PLAN_VERSION,
  s.EVENT_TYPE, s.EVENT_DATA, s.IDEMPOTENCY_KEY, s.CAUSED_BY_SIGNAL_ID, s.PARENT_EVENT_ID, s.EMITTED_AT,
  s.PERSISTED_AT, s.ADAPTER_VERSION, s.ENGINE_RUN_REF, s.POSITION
);

-- name: insert_new_events
-- merge_events' effect without MERGE (insert the rows whose key is not there yet), for fakesnow, whose
-- MERGE cannot run inside a transaction. {rows} as in merge_events.
INSERT INTO RUN_EVENTS (
  RUN_ID, RUN_SEQ, EVENT_ID, STEP_ID, ENGINE_ATTEMPT_ID, LOGICAL_ATTEMPT_ID, PLAN_VERSION, EVENT_TYPE,
  EVENT_DATA, IDEMPOTENCY_KEY, CAUSED_BY_SIGNAL_ID, PARENT_EVENT_ID, EMITTED_AT, PERSISTED_AT,
  ADAPTER_VERSION, ENGINE_RUN_REF, POSITION
)
SELECT s.RUN_ID, s.RUN_SEQ, s.EVENT_ID, s.STEP_ID, s.ENGINE_ATTEMPT_ID, s.LOGICAL_ATTEMPT_ID, s.PLAN_VERSION,
       s.EVENT_TYPE, s.EVENT_DATA, s.IDEMPOTENCY_KEY, s.CAUSED_BY_SIGNAL_ID, s.PARENT_EVENT_ID, s.EMITTED_AT,
       s.PERSISTED_AT, s.ADAPTER_VERSION, s.ENGINE_RUN_REF, s.POSITION
FROM (
  SELECT column1 AS RUN_ID, column2 AS RUN_SEQ, column3 AS EVENT_ID, column4 AS STEP_ID,
         column5 AS ENGINE_ATTEMPT_ID, column6 AS LOGICAL_ATTEMPT_ID, column7 AS PLAN_VERSION,
         column8 AS EVENT_TYPE, PARSE_JSON(column9) AS EVENT_DATA, column10 AS IDEMPOTENCY_KEY,
         column11 AS CAUSED_BY_SIGNAL_ID, column12 AS PARENT_EVENT_ID, column13::TIMESTAMP_TZ AS EMITTED_AT,
         COALESCE(column14::TIMESTAMP_TZ, CURRENT_TIMESTAMP()) AS PERSISTED_AT, column15 AS ADAPTER_VERSION,
         PARSE_JSON(column16) AS ENGINE_RUN_REF, column17 AS POSITION
  FROM VALUES {rows}
) s
WHERE NOT EXISTS (
  SELECT 1 FROM RUN_EVENTS t WHERE t.RUN_ID = s.RUN_ID AND t.IDEMPOTENCY_KEY = s.IDEMPOTENCY_KEY
);

-- name: next_position
-- Taken before the append's transaction: fakesnow cannot take a sequence value in one that has written.
SELECT RUN_EVENTS_POSITION_SEQ.NEXTVAL;

-- name: advance_stream
-- Absolute values, never `x = x + n`: a statement the connector re-sends cannot double-count.
UPDATE RUN_STREAMS
   SET LAST_SEQ = %s, EVENT_COUNT = %s,
       FIRST_EVENT_AT = COALESCE(FIRST_EVENT_AT, %s::TIMESTAMP_TZ),
       STARTED_AT = COALESCE(STARTED_AT, %s::TIMESTAMP_TZ),
       COMPLETED_AT = COALESCE(COMPLETED_AT, %s::TIMESTAMP_TZ),
       UPDATED_AT = CURRENT_TIMESTAMP()
 WHERE RUN_ID = %s;
