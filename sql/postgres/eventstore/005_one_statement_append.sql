-- The one-statement append (runstate/eventstore/pg_append.py): in autocommit, a single statement
-- upserts the run's stream row (its row lock serialises the run's writers), inserts the batch at
-- the seqs after the stream's last_seq, and writes the snapshot the client computed from what it
-- last saw of the run, all in one round trip. This function, called last in that statement, checks
-- what the client could only guess, and aborts the whole statement (SQLSTATE RSK02) when a guess
-- was wrong; the client then appends the slow way (lock, look, insert, in a transaction):
-- - the run is archived: its idempotency keys live in run_events_archive, which the insert's unique
--   index cannot see;
-- - `expected` (optimistic concurrency) is not where the run stands;
-- - a snapshot is due and none was sent, or one was sent for another position of the run.
CREATE OR REPLACE FUNCTION runstate_check_append(
  before BIGINT, count_before BIGINT, archived BOOLEAN, expected BIGINT, added BIGINT,
  every BIGINT, signal_waiting BOOLEAN, snapshot_seq BIGINT, snapshot_count_before BIGINT
) RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
  due BOOLEAN := (count_before + added) / every > count_before / every OR signal_waiting;
BEGIN
  IF archived THEN
    RAISE EXCEPTION 'the run is archived' USING ERRCODE = 'RSK02';
  ELSIF expected IS NOT NULL AND before <> expected THEN
    RAISE EXCEPTION 'the run is at seq %, not %', before, expected USING ERRCODE = 'RSK02';
  ELSIF snapshot_seq IS NULL AND due THEN
    RAISE EXCEPTION 'a snapshot is due' USING ERRCODE = 'RSK02';
  ELSIF snapshot_seq IS NOT NULL
        AND (snapshot_seq <> before + added OR snapshot_count_before <> count_before) THEN
    RAISE EXCEPTION 'the snapshot was made for another position of the run' USING ERRCODE = 'RSK02';
  END IF;
  RETURN before;
END
$$;
