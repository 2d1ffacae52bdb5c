-- Run state store (seed 001), created inside the target schema (search_path).
--
-- run_streams is the per-run stream row (Marten's mt_streams): an append locks ONLY its run's row
-- and takes run_seq from last_seq, so run_seq is assigned atomically per run with no table-wide
-- lock. (The seed's `SELECT MAX(run_seq) ... FOR UPDATE` is rejected by Postgres: FOR UPDATE is
-- not allowed with aggregate functions.)
CREATE TABLE IF NOT EXISTS run_streams (
  run_id          TEXT        PRIMARY KEY,
  last_seq        BIGINT      NOT NULL DEFAULT 0,
  event_count     BIGINT      NOT NULL DEFAULT 0,
  first_event_at  TIMESTAMPTZ,
  started_at      TIMESTAMPTZ,
  completed_at    TIMESTAMPTZ,
  archived_at     TIMESTAMPTZ,
  created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
  updated_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS idx_run_streams_completed ON run_streams (completed_at) WHERE completed_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS idx_run_streams_started ON run_streams ((COALESCE(started_at, first_event_at)));

-- run_events as in seed 001 (plus plan_version, part of the idempotency key). Hash partitioning
-- (seed 6.1) is switched on by configuration: the session setting `runstate.event_partitions`
-- (PostgresEventStore(partitions=N) passes it as a connection option) creates the table
-- PARTITION BY HASH (run_id) with N partitions when the table does not exist yet. PK and UNIQUE
-- both contain run_id, the partition key, so they stay enforced on a partitioned table.
DO $$
DECLARE
  partitions INT := COALESCE(NULLIF(current_setting('runstate.event_partitions', true), ''), '0')::INT;
  columns TEXT := '
    run_id              TEXT        NOT NULL,
    run_seq             BIGINT      NOT NULL,
    event_id            UUID        NOT NULL DEFAULT gen_random_uuid(),
    step_id             TEXT,
    engine_attempt_id   TEXT,
    logical_attempt_id  TEXT,
    plan_version        TEXT,
    event_type          TEXT        NOT NULL,
    event_data          JSONB,
    idempotency_key     TEXT        NOT NULL,
    caused_by_signal_id UUID,
    parent_event_id     UUID,
    emitted_at          TIMESTAMPTZ NOT NULL,
    persisted_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    adapter_version     TEXT,
    engine_run_ref      JSONB,
    PRIMARY KEY (run_id, run_seq),
    UNIQUE (run_id, idempotency_key)';
BEGIN
  IF to_regclass(format('%I.run_events', current_schema())) IS NOT NULL THEN
    RETURN;
  END IF;
  IF partitions > 0 THEN
    EXECUTE format('CREATE TABLE run_events (%s) PARTITION BY HASH (run_id)', columns);
    FOR i IN 0 .. partitions - 1 LOOP
      EXECUTE format('CREATE TABLE %I PARTITION OF run_events FOR VALUES WITH (MODULUS %s, REMAINDER %s)',
                     'run_events_p' || i, partitions, i);
    END LOOP;
  ELSE
    EXECUTE format('CREATE TABLE run_events (%s)', columns);
  END IF;
END
$$;

-- The seed's idx_run_events_runid_runseq and idx_run_events_idempotency duplicate exactly the
-- PRIMARY KEY and UNIQUE indexes above; they are left out so each append maintains two b-trees, not four.
CREATE INDEX IF NOT EXISTS idx_run_events_eventtype ON run_events (event_type)
  WHERE event_type IN ('RunCompleted', 'RunFailed', 'RunCancelled');

COMMENT ON TABLE run_events IS 'Append-only event log (source of truth for all execution state)';
COMMENT ON COLUMN run_events.run_seq IS 'Monotonic sequence per run_id (gaps allowed, assigned by append authority)';
COMMENT ON COLUMN run_events.idempotency_key IS 'SHA256(runId | stepId | logicalAttemptId | eventType | planVersion)';

-- Projection (seed 5.2 table, filled by project(), not by a trigger): watermark + optimistic version.
CREATE TABLE IF NOT EXISTS run_snapshots (
  run_id          TEXT        PRIMARY KEY,
  status          TEXT        NOT NULL,
  last_event_seq  BIGINT      NOT NULL,
  snapshot_data   JSONB       NOT NULL,
  started_at      TIMESTAMPTZ,
  completed_at    TIMESTAMPTZ,
  projected_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
  version         BIGINT      NOT NULL DEFAULT 0
);

-- Periodic state snapshots (seed 003): a separate table, UNIQUE (run_id, seq), latest N kept.
CREATE TABLE IF NOT EXISTS run_state_snapshots (
  run_id        TEXT        NOT NULL,
  seq           BIGINT      NOT NULL,
  kind          TEXT        NOT NULL CHECK (kind IN ('state', 'projection')),
  encoding      TEXT        NOT NULL CHECK (encoding IN ('json', 'json+zlib')),
  payload       BYTEA       NOT NULL,
  checksum      TEXT        NOT NULL,
  raw_bytes     INTEGER     NOT NULL,
  stored_bytes  INTEGER     NOT NULL,
  reason        TEXT        NOT NULL,
  created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, seq)
);

-- Archive (seed 000 6.3): same columns as run_events plus archived_at.
CREATE TABLE IF NOT EXISTS run_events_archive (
  run_id              TEXT        NOT NULL,
  run_seq             BIGINT      NOT NULL,
  event_id            UUID        NOT NULL,
  step_id             TEXT,
  engine_attempt_id   TEXT,
  logical_attempt_id  TEXT,
  plan_version        TEXT,
  event_type          TEXT        NOT NULL,
  event_data          JSONB,
  idempotency_key     TEXT        NOT NULL,
  caused_by_signal_id UUID,
  parent_event_id     UUID,
  emitted_at          TIMESTAMPTZ NOT NULL,
  persisted_at        TIMESTAMPTZ NOT NULL,
  adapter_version     TEXT,
  engine_run_ref      JSONB,
  archived_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, run_seq),
  UNIQUE (run_id, idempotency_key)
);
