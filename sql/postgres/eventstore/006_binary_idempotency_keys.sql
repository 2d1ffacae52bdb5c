-- The idempotency key as bytes, not text: a key of 64 lowercase hex digits (every default key, a SHA-256)
-- is stored as its 32 bytes, any other key as its UTF-8 bytes, followed by one 0xFF byte when those are
-- exactly 32 long (UTF-8 never holds 0xFF, so no text key reads back as a hex one). The store converts at
-- its edge (runstate/eventstore/pg_sql.py: key_bytes, key_text); its API still takes and gives the text.
-- Measured on 1.09M events: 629 bytes per event (table and indexes) before, 542 after; the unique
-- (run_id, idempotency_key) index went from 153 to 103 bytes per event.
--
-- Both event tables are built again beside the old ones (named *_rekeyed until the end) and the rows are
-- copied over in batches in primary key order, each batch in a transaction of its own that also moves the
-- cursor in rekey_progress: a killed upgrade resumes after the last batch it committed (runstate/migrations).
-- The last part, under a lock, makes each new table hold exactly its old one's rows (writers, archives and
-- restores may run during the copy) and takes the old names over.

-- Applied again when a killed upgrade resumes: once the new tables exist it changes nothing.
CREATE OR REPLACE FUNCTION runstate_key_bytes(key TEXT) RETURNS BYTEA LANGUAGE sql IMMUTABLE STRICT AS $$
  SELECT CASE WHEN key ~ '^[0-9a-f]{64}$' THEN decode(key, 'hex')
              WHEN octet_length(key) = 32 THEN convert_to(key, 'UTF8') || '\xff'::bytea
              ELSE convert_to(key, 'UTF8') END
$$;

DO $$
DECLARE
  -- Hash partitioning (001_eventstore.sql) was chosen when run_events was created: keep it.
  partitions INT := (SELECT count(*) FROM pg_inherits
                     WHERE inhparent = format('%I.run_events', current_schema())::regclass);
BEGIN
  IF to_regclass(format('%I.run_events_rekeyed', current_schema())) IS NOT NULL THEN
    RETURN;
  END IF;
  -- run_events' columns and defaults, with the key as bytes (the new table is empty: nothing to convert).
  EXECUTE format('CREATE TABLE run_events_rekeyed (LIKE run_events INCLUDING DEFAULTS,'
                 ' PRIMARY KEY (run_id, run_seq), UNIQUE (run_id, idempotency_key))%s',
                 CASE WHEN partitions > 0 THEN ' PARTITION BY HASH (run_id)' ELSE '' END);
  ALTER TABLE run_events_rekeyed ALTER COLUMN idempotency_key TYPE BYTEA USING NULL;
  FOR i IN 0 .. partitions - 1 LOOP
    EXECUTE format('CREATE TABLE %I PARTITION OF run_events_rekeyed FOR VALUES WITH (MODULUS %s, REMAINDER %s)',
                   'run_events_rekeyed_p' || i, partitions, i);
  END LOOP;
  CREATE INDEX idx_run_events_rekeyed_event_type ON run_events_rekeyed (event_type);
  CREATE INDEX idx_run_events_rekeyed_event_data ON run_events_rekeyed USING GIN (event_data jsonb_path_ops);
  CREATE INDEX idx_run_events_rekeyed_position ON run_events_rekeyed (position);

  -- The archive's columns are the events' (without their defaults: it keeps what it is given), and
  -- archived_at.
  CREATE TABLE run_events_archive_rekeyed (
    LIKE run_events_rekeyed,
    archived_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, run_seq),
    UNIQUE (run_id, idempotency_key)
  );
  CREATE INDEX idx_run_events_archive_rekeyed_position ON run_events_archive_rekeyed (position);

  -- The last (run_id, run_seq) copied from each table; ('', 0) sorts before every event.
  CREATE TABLE rekey_progress (from_table TEXT PRIMARY KEY, run_id TEXT NOT NULL, run_seq BIGINT NOT NULL);
  INSERT INTO rekey_progress VALUES ('run_events', '', 0), ('run_events_archive', '', 0);
END
$$;

-- migrate: repeat
-- The next 10,000 events of run_events after the cursor, and the cursor after them; returns how many.
WITH mark AS (
  SELECT run_id, run_seq FROM rekey_progress WHERE from_table = 'run_events'
), batch AS (
  SELECT * FROM run_events
   WHERE (run_id, run_seq) > ((SELECT run_id FROM mark), (SELECT run_seq FROM mark))
   ORDER BY run_id, run_seq LIMIT 10000
), copied AS (
  INSERT INTO run_events_rekeyed (run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id,
                                  plan_version, event_type, event_data, idempotency_key, caused_by_signal_id,
                                  parent_event_id, emitted_at, persisted_at, adapter_version, engine_run_ref,
                                  position)
  SELECT run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version, event_type,
         event_data, runstate_key_bytes(idempotency_key), caused_by_signal_id, parent_event_id, emitted_at,
         persisted_at, adapter_version, engine_run_ref, position
    FROM batch
  RETURNING run_id, run_seq
), moved AS (
  UPDATE rekey_progress SET (run_id, run_seq) = (
    SELECT run_id, run_seq FROM copied ORDER BY run_id DESC, run_seq DESC LIMIT 1)
   WHERE from_table = 'run_events' AND EXISTS (SELECT 1 FROM copied)
)
SELECT count(*) FROM copied;

-- migrate: repeat
-- The same for run_events_archive.
WITH mark AS (
  SELECT run_id, run_seq FROM rekey_progress WHERE from_table = 'run_events_archive'
), batch AS (
  SELECT * FROM run_events_archive
   WHERE (run_id, run_seq) > ((SELECT run_id FROM mark), (SELECT run_seq FROM mark))
   ORDER BY run_id, run_seq LIMIT 10000
), copied AS (
  INSERT INTO run_events_archive_rekeyed (run_id, run_seq, event_id, step_id, engine_attempt_id,
                                          logical_attempt_id, plan_version, event_type, event_data,
                                          idempotency_key, caused_by_signal_id, parent_event_id, emitted_at,
                                          persisted_at, adapter_version, engine_run_ref, archived_at, position)
  SELECT run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version, event_type,
         event_data, runstate_key_bytes(idempotency_key), caused_by_signal_id, parent_event_id, emitted_at,
         persisted_at, adapter_version, engine_run_ref, archived_at, position
    FROM batch
  RETURNING run_id, run_seq
), moved AS (
  UPDATE rekey_progress SET (run_id, run_seq) = (
    SELECT run_id, run_seq FROM copied ORDER BY run_id DESC, run_seq DESC LIMIT 1)
   WHERE from_table = 'run_events_archive' AND EXISTS (SELECT 1 FROM copied)
)
SELECT count(*) FROM copied;

-- migrate: finally
-- Under a lock that keeps writers out until the old tables are gone, each new table is made to hold
-- exactly the rows of its old one: an event an archive (or a restore) moved after its batch was copied
-- leaves the table it left, and events a writer added behind the cursor meanwhile are copied. Then the
-- new tables and their indexes take the old names.
LOCK TABLE run_events, run_events_archive IN SHARE MODE;
DELETE FROM run_events_rekeyed n
 WHERE NOT EXISTS (SELECT 1 FROM run_events e WHERE e.run_id = n.run_id AND e.run_seq = n.run_seq);
DELETE FROM run_events_archive_rekeyed n
 WHERE NOT EXISTS (SELECT 1 FROM run_events_archive a WHERE a.run_id = n.run_id AND a.run_seq = n.run_seq);
INSERT INTO run_events_rekeyed (run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id,
                                plan_version, event_type, event_data, idempotency_key, caused_by_signal_id,
                                parent_event_id, emitted_at, persisted_at, adapter_version, engine_run_ref,
                                position)
SELECT run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version, event_type,
       event_data, runstate_key_bytes(idempotency_key), caused_by_signal_id, parent_event_id, emitted_at,
       persisted_at, adapter_version, engine_run_ref, position
  FROM run_events e
 WHERE NOT EXISTS (SELECT 1 FROM run_events_rekeyed n WHERE n.run_id = e.run_id AND n.run_seq = e.run_seq);
INSERT INTO run_events_archive_rekeyed (run_id, run_seq, event_id, step_id, engine_attempt_id,
                                        logical_attempt_id, plan_version, event_type, event_data,
                                        idempotency_key, caused_by_signal_id, parent_event_id, emitted_at,
                                        persisted_at, adapter_version, engine_run_ref, archived_at, position)
SELECT run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version, event_type,
       event_data, runstate_key_bytes(idempotency_key), caused_by_signal_id, parent_event_id, emitted_at,
       persisted_at, adapter_version, engine_run_ref, archived_at, position
  FROM run_events_archive a
 WHERE NOT EXISTS (SELECT 1 FROM run_events_archive_rekeyed n WHERE n.run_id = a.run_id AND n.run_seq = a.run_seq);
DROP TABLE run_events, run_events_archive, rekey_progress;
DROP FUNCTION runstate_key_bytes(TEXT);
DO $$
DECLARE
  rel RECORD;
BEGIN
  FOR rel IN SELECT relname, relkind FROM pg_class
              WHERE relnamespace = current_schema()::regnamespace AND relname LIKE '%\_rekeyed%' LOOP
    EXECUTE format('ALTER %s %I RENAME TO %I', CASE WHEN rel.relkind IN ('i', 'I') THEN 'INDEX' ELSE 'TABLE' END,
                   rel.relname, replace(rel.relname, '_rekeyed', ''));
  END LOOP;
END
$$;
CREATE OR REPLACE TRIGGER run_events_feed_notify AFTER INSERT ON run_events
  FOR EACH STATEMENT EXECUTE FUNCTION runstate_feed_notify();
COMMENT ON TABLE run_events IS 'Append-only event log (source of truth for all execution state)';
COMMENT ON COLUMN run_events.run_seq IS 'Monotonic sequence per run_id (gaps allowed, assigned by append authority)';
COMMENT ON COLUMN run_events.idempotency_key IS
  'SHA256(runId | stepId | logicalAttemptId | eventType | planVersion) as 32 bytes; another key as its UTF-8';
ANALYZE run_events, run_events_archive;
