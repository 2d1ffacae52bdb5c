-- Iceberg maintenance (Snowpack data model): queue, fences, locks, catalog cache, health, orchestrator audit.
-- Tables, columns, constraints and indexes are exactly the seed's (shared/seeds/004_*). Applied inside the
-- target schema by runstate.migrations (search_path), so every name here is unqualified.
-- Where the seed leaves a detail open it is filled in and commented: CHECKs on status values, the FK
-- actions (the seed names the references, not what happens on delete), and the columns of idx_jobs_visible.

CREATE TABLE jobs (
    job_id        TEXT PRIMARY KEY,
    database_name TEXT NOT NULL,
    table_name    TEXT NOT NULL,
    actions       TEXT[] NOT NULL,
    dry_run       BOOL NOT NULL,
    -- The seed lists the five states in prose; a CHECK keeps a typo out of the table.
    status        TEXT NOT NULL CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    submitted_at  TIMESTAMPTZ NOT NULL,
    started_at    TIMESTAMPTZ,
    completed_at  TIMESTAMPTZ,
    error         TEXT,
    created_at    TIMESTAMPTZ DEFAULT NOW(),
    attempt_id    TEXT,            -- DL-197 fence: the current claim's unique id
    deleted_at    TIMESTAMPTZ      -- soft-delete tombstone
);

-- Rows exist only while a job is in flight (pending or running); deleted on ack.
CREATE TABLE job_queue (
    -- ON DELETE CASCADE: removing a job can never strand its queue row.
    job_id        TEXT PRIMARY KEY REFERENCES jobs (job_id) ON DELETE CASCADE,
    enqueued_at   TIMESTAMPTZ DEFAULT NOW(),
    visible_at    TIMESTAMPTZ NOT NULL,   -- claim lease deadline: re-claimable after this time
    claimed_at    TIMESTAMPTZ,
    claimed_by    TEXT,
    attempt_id    TEXT,                   -- fence echo: must match jobs.attempt_id
    attempt_count INT DEFAULT 0
);

CREATE TABLE job_actions (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id          TEXT REFERENCES jobs (job_id) ON DELETE CASCADE,
    action          TEXT NOT NULL,
    success         BOOL NOT NULL,
    message         TEXT NOT NULL DEFAULT '',
    error           TEXT,
    elapsed_seconds DOUBLE PRECISION NOT NULL DEFAULT 0.0,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT NOW()
);

CREATE TABLE table_locks (
    table_key   TEXT PRIMARY KEY,       -- "{database}.{table}"
    holder      TEXT NOT NULL,          -- job_id of the lock owner
    acquired_at TIMESTAMPTZ DEFAULT NOW(),
    expires_at  TIMESTAMPTZ NOT NULL
);

CREATE TABLE table_cache_entries (
    database_name       TEXT,
    table_name          TEXT,
    maintenance_enabled BOOL,
    payload             JSONB,
    PRIMARY KEY (database_name, table_name)
);

CREATE TABLE table_cache_meta (
    id             INT PRIMARY KEY CHECK (id = 1),   -- single-row invariant
    last_synced_at TIMESTAMPTZ
);

CREATE TABLE health_snapshots (
    id                        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    database_name             TEXT NOT NULL,
    table_name                TEXT NOT NULL,
    total_data_files          INTEGER NOT NULL DEFAULT 0,
    total_delete_files        INTEGER NOT NULL DEFAULT 0,
    total_size_bytes          BIGINT NOT NULL DEFAULT 0,
    avg_file_size_bytes       DOUBLE PRECISION NOT NULL DEFAULT 0.0,
    small_file_count          INTEGER NOT NULL DEFAULT 0,
    small_file_pct            DOUBLE PRECISION NOT NULL DEFAULT 0.0,
    snapshot_count            INTEGER NOT NULL DEFAULT 0,
    manifest_count            INTEGER NOT NULL DEFAULT 0,
    needs_maintenance         BOOLEAN NOT NULL,
    maintenance_enabled       BOOLEAN,            -- NULL: property unset or unrecognised
    maintenance_cadence_hours INTEGER,
    recommended_actions       TEXT[] NOT NULL DEFAULT '{}',
    error                     TEXT,
    total_records             BIGINT DEFAULT 0,
    snapshot_id               BIGINT DEFAULT 0,
    health_status             TEXT DEFAULT 'Unknown',
    hours_since_last_snapshot DOUBLE PRECISION DEFAULT 0,
    oldest_snapshot_age_hours DOUBLE PRECISION DEFAULT 0,
    checked_at                TIMESTAMPTZ NOT NULL DEFAULT NOW()
);

CREATE TABLE orchestrator_runs (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at      TIMESTAMPTZ NOT NULL,
    completed_at    TIMESTAMPTZ NOT NULL,
    status          TEXT NOT NULL,
    tables_assessed INTEGER NOT NULL DEFAULT 0,
    tables_skipped  INTEGER NOT NULL DEFAULT 0,
    tables_healthy  INTEGER NOT NULL DEFAULT 0,
    jobs_submitted  INTEGER NOT NULL DEFAULT 0,
    jobs_completed  INTEGER NOT NULL DEFAULT 0,
    jobs_failed     INTEGER NOT NULL DEFAULT 0,
    dry_run         BOOLEAN NOT NULL DEFAULT FALSE,
    error           TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT NOW()
);

CREATE INDEX idx_jobs_table ON jobs (database_name, table_name, submitted_at DESC);
CREATE INDEX idx_jobs_status ON jobs (status, submitted_at DESC);
CREATE INDEX idx_jobs_submitted ON jobs (submitted_at DESC);
-- The seed gives only the predicate; (submitted_at DESC) matches the live listing's order.
CREATE INDEX idx_jobs_visible ON jobs (submitted_at DESC) WHERE deleted_at IS NULL;
CREATE INDEX idx_job_actions_job_id ON job_actions (job_id);
CREATE INDEX idx_job_actions_action ON job_actions (action, created_at DESC);
CREATE INDEX idx_job_queue_ready ON job_queue (visible_at) WHERE claimed_at IS NULL;
CREATE INDEX idx_job_queue_claimed ON job_queue (visible_at) WHERE claimed_at IS NOT NULL;
CREATE INDEX idx_table_locks_expires ON table_locks (expires_at);
CREATE INDEX idx_table_cache_maintenance ON table_cache_entries (maintenance_enabled) WHERE maintenance_enabled = TRUE;
CREATE INDEX idx_health_table ON health_snapshots (database_name, table_name, checked_at DESC);
CREATE INDEX idx_health_checked_at ON health_snapshots (checked_at DESC);
CREATE INDEX idx_orchestrator_runs_started ON orchestrator_runs (started_at DESC);

-- The live-read joined view: every job that is not soft-deleted, with its queue state while in flight.
CREATE VIEW live_jobs AS
SELECT j.job_id, j.database_name, j.table_name, j.actions, j.dry_run, j.status,
       j.submitted_at, j.started_at, j.completed_at, j.error, j.created_at, j.attempt_id, j.deleted_at,
       q.enqueued_at, q.visible_at, q.claimed_at, q.claimed_by, q.attempt_count
FROM jobs j
LEFT JOIN job_queue q ON q.job_id = j.job_id
WHERE j.deleted_at IS NULL;
