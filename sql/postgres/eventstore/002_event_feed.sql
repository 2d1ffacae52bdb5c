-- The global feed: every event gets a position, across runs, that a reader can follow without
-- skipping an event whose transaction commits late.
--
-- position = (id of the writing transaction << 20) | the event's 1-based place in its batch.
-- A reader returns only positions below (xmin of its snapshot << 20): every transaction with an
-- id below xmin has ended, and any transaction that commits later has an id >= xmin, so it can
-- only add positions above what the reader has returned. A transaction held open holds the feed
-- back (and, xmin being cluster-wide, so does one in another database); it never makes it skip.
ALTER TABLE run_events ADD COLUMN IF NOT EXISTS position BIGINT;
ALTER TABLE run_events_archive ADD COLUMN IF NOT EXISTS position BIGINT;

-- Events written before the feed existed come first, in the order they were persisted.
WITH numbered AS (
  SELECT run_id, run_seq, row_number() OVER (ORDER BY persisted_at, run_id, run_seq) AS n
  FROM run_events WHERE position IS NULL
)
UPDATE run_events e SET position = numbered.n
  FROM numbered WHERE e.run_id = numbered.run_id AND e.run_seq = numbered.run_seq;
WITH numbered AS (
  SELECT run_id, run_seq, row_number() OVER (ORDER BY persisted_at, run_id, run_seq) AS n
  FROM run_events_archive WHERE position IS NULL
)
UPDATE run_events_archive a SET position = numbered.n + (SELECT count(*) FROM run_events)
  FROM numbered WHERE a.run_id = numbered.run_id AND a.run_seq = numbered.run_seq;

-- The store always sets position; the default only keeps a hand-written INSERT inside the feed.
ALTER TABLE run_events ALTER COLUMN position SET DEFAULT (pg_current_xact_id()::text::bigint << 20);
ALTER TABLE run_events ALTER COLUMN position SET NOT NULL;
ALTER TABLE run_events_archive ALTER COLUMN position SET NOT NULL;
CREATE INDEX IF NOT EXISTS idx_run_events_position ON run_events (position);
CREATE INDEX IF NOT EXISTS idx_run_events_archive_position ON run_events_archive (position);

-- Wake subscribers (LISTEN runstate_feed; the payload is the schema). Statement-level: one
-- notification per append, delivered at COMMIT, none on ROLLBACK. Subscribers also poll, so a
-- lost notification only delays them.
CREATE OR REPLACE FUNCTION runstate_feed_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('runstate_feed', TG_TABLE_SCHEMA);
  RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER run_events_feed_notify AFTER INSERT ON run_events
  FOR EACH STATEMENT EXECUTE FUNCTION runstate_feed_notify();

-- The append sends its insert, snapshot and COMMIT in one pipeline, so a short insert (an
-- idempotency key already stored, skipped by ON CONFLICT) must abort the transaction itself
-- rather than wait for the client to look: this raises SQLSTATE RSK01, and the store then
-- appends again looking the stored keys up first.
CREATE OR REPLACE FUNCTION runstate_expect_inserted(inserted BIGINT, expected BIGINT) RETURNS BIGINT
LANGUAGE plpgsql AS $$
BEGIN
  IF inserted <> expected THEN
    RAISE EXCEPTION 'an idempotency key of the batch is already stored' USING ERRCODE = 'RSK01';
  END IF;
  RETURN inserted;
END
$$;
