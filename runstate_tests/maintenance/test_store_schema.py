"""The maintenance migration creates exactly the seed's tables, columns, constraints, indexes and view."""

from __future__ import annotations

import psycopg
import pytest

from runstate.maintenance import CachedTable, MaintenanceStore

# (column, udt_name, nullable) in the order of the Snowpack data model (seed 004, docs/ARCHITECTURE.md).
SEED_COLUMNS: dict[str, list[tuple[str, str, bool]]] = {
    "jobs": [
        ("job_id", "text", False),
        ("database_name", "text", False),
        ("table_name", "text", False),
        ("actions", "_text", False),
        ("dry_run", "bool", False),
        ("status", "text", False),
        ("submitted_at", "timestamptz", False),
        ("started_at", "timestamptz", True),
        ("completed_at", "timestamptz", True),
        ("error", "text", True),
        ("created_at", "timestamptz", True),
        ("attempt_id", "text", True),
        ("deleted_at", "timestamptz", True),
    ],
    "job_queue": [
        ("job_id", "text", False),
        ("enqueued_at", "timestamptz", True),
        ("visible_at", "timestamptz", False),
        ("claimed_at", "timestamptz", True),
        ("claimed_by", "text", True),
        ("attempt_id", "text", True),
        ("attempt_count", "int4", True),
    ],
    "job_actions": [
        ("id", "int8", False),
        ("job_id", "text", True),
        ("action", "text", False),
        ("success", "bool", False),
        ("message", "text", False),
        ("error", "text", True),
        ("elapsed_seconds", "float8", False),
        ("created_at", "timestamptz", False),
    ],
    "table_locks": [
        ("table_key", "text", False),
        ("holder", "text", False),
        ("acquired_at", "timestamptz", True),
        ("expires_at", "timestamptz", False),
    ],
    "table_cache_entries": [
        ("database_name", "text", False),
        ("table_name", "text", False),
        ("maintenance_enabled", "bool", True),
        ("payload", "jsonb", True),
    ],
    "table_cache_meta": [("id", "int4", False), ("last_synced_at", "timestamptz", True)],
    "health_snapshots": [
        ("id", "int8", False),
        ("database_name", "text", False),
        ("table_name", "text", False),
        ("total_data_files", "int4", False),
        ("total_delete_files", "int4", False),
        ("total_size_bytes", "int8", False),
        ("avg_file_size_bytes", "float8", False),
        ("small_file_count", "int4", False),
        ("small_file_pct", "float8", False),
        ("snapshot_count", "int4", False),
        ("manifest_count", "int4", False),
        ("needs_maintenance", "bool", False),
        ("maintenance_enabled", "bool", True),
        ("maintenance_cadence_hours", "int4", True),
        ("recommended_actions", "_text", False),
        ("error", "text", True),
        ("total_records", "int8", True),
        ("snapshot_id", "int8", True),
        ("health_status", "text", True),
        ("hours_since_last_snapshot", "float8", True),
        ("oldest_snapshot_age_hours", "float8", True),
        ("checked_at", "timestamptz", False),
    ],
    "orchestrator_runs": [
        ("id", "int8", False),
        ("started_at", "timestamptz", False),
        ("completed_at", "timestamptz", False),
        ("status", "text", False),
        ("tables_assessed", "int4", False),
        ("tables_skipped", "int4", False),
        ("tables_healthy", "int4", False),
        ("jobs_submitted", "int4", False),
        ("jobs_completed", "int4", False),
        ("jobs_failed", "int4", False),
        ("dry_run", "bool", False),
        ("error", "text", True),
        ("created_at", "timestamptz", False),
    ],
}
# The one documented extension (sql/postgres/maintenance/011): per-job action options, appended to jobs.
EXTENSION_COLUMNS = {
    "jobs": [("options", "jsonb", False)],
    "job_actions": [("before", "jsonb", False), ("after", "jsonb", False)],
}

SEED_INDEXES = {
    "idx_jobs_table": ("jobs", "(database_name, table_name, submitted_at DESC)", None),
    "idx_jobs_status": ("jobs", "(status, submitted_at DESC)", None),
    "idx_jobs_submitted": ("jobs", "(submitted_at DESC)", None),
    "idx_jobs_visible": ("jobs", "(submitted_at DESC)", "WHERE (deleted_at IS NULL)"),
    "idx_job_actions_job_id": ("job_actions", "(job_id)", None),
    "idx_job_actions_action": ("job_actions", "(action, created_at DESC)", None),
    "idx_job_queue_ready": ("job_queue", "(visible_at)", "WHERE (claimed_at IS NULL)"),
    "idx_job_queue_claimed": ("job_queue", "(visible_at)", "WHERE (claimed_at IS NOT NULL)"),
    "idx_table_locks_expires": ("table_locks", "(expires_at)", None),
    "idx_table_cache_maintenance": (
        "table_cache_entries",
        "(maintenance_enabled)",
        "WHERE (maintenance_enabled = true)",
    ),
    "idx_health_table": ("health_snapshots", "(database_name, table_name, checked_at DESC)", None),
    "idx_health_checked_at": ("health_snapshots", "(checked_at DESC)", None),
    "idx_orchestrator_runs_started": ("orchestrator_runs", "(started_at DESC)", None),
}
PRIMARY_KEYS = {
    "jobs": ["job_id"],
    "job_queue": ["job_id"],
    "job_actions": ["id"],
    "table_locks": ["table_key"],
    "table_cache_entries": ["database_name", "table_name"],
    "table_cache_meta": ["id"],
    "health_snapshots": ["id"],
    "orchestrator_runs": ["id"],
}


def _rows(dsn: str, query: str, *params: object) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query, params).fetchall()


def test_tables_have_exactly_the_seed_columns(
    store: MaintenanceStore, pg_database: str, pg_schema: str
) -> None:
    tables = {
        name
        for (name,) in _rows(
            pg_database,
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = %s AND table_type = 'BASE TABLE'",
            pg_schema,
        )
    }
    # The schema also holds the other domains' tables (one migration chain per schema).
    assert set(SEED_COLUMNS) <= tables
    for table, expected in SEED_COLUMNS.items():
        got = _rows(
            pg_database,
            "SELECT column_name, udt_name, is_nullable = 'YES' FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
            pg_schema,
            table,
        )
        assert got == expected + EXTENSION_COLUMNS.get(table, []), table


def test_every_seed_index_exists_with_its_definition(
    store: MaintenanceStore, pg_database: str, pg_schema: str
) -> None:
    rows = _rows(
        pg_database, "SELECT indexname, tablename, indexdef FROM pg_indexes WHERE schemaname = %s", pg_schema
    )
    secondary = {
        name: (table, ddl)
        for name, table, ddl in rows
        if table in SEED_COLUMNS and not name.endswith("_pkey")
    }
    assert set(secondary) == set(SEED_INDEXES)
    for name, (table, columns, predicate) in SEED_INDEXES.items():
        got_table, ddl = secondary[name]
        assert got_table == table
        assert f"USING btree {columns}" in ddl, ddl
        assert ddl.endswith(predicate) if predicate else "WHERE" not in ddl, ddl


def test_primary_keys_match_the_seed(store: MaintenanceStore, pg_database: str, pg_schema: str) -> None:
    for table, columns in PRIMARY_KEYS.items():
        got = _rows(
            pg_database,
            "SELECT a.attname FROM pg_index i"
            " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
            " WHERE i.indrelid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass AND i.indisprimary"
            " ORDER BY array_position(i.indkey::int2[], a.attnum)",
            pg_schema,
            table,
        )
        assert [name for (name,) in got] == columns, table


def test_foreign_keys_point_at_jobs(store: MaintenanceStore, pg_database: str, pg_schema: str) -> None:
    got = _rows(
        pg_database,
        "SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint"
        " WHERE contype = 'f' AND connamespace = %s::regnamespace ORDER BY 1",
        pg_schema,
    )
    pairs = [(src.split(".")[-1], dst.split(".")[-1]) for src, dst in got]
    assert [pair for pair in pairs if pair[0] in SEED_COLUMNS] == [
        ("job_actions", "jobs"),
        ("job_queue", "jobs"),
    ]


def test_table_cache_meta_holds_a_single_row(
    store: MaintenanceStore, pg_database: str, pg_schema: str
) -> None:
    store.cache.replace_table_cache([])
    with psycopg.connect(pg_database) as conn:
        conn.execute(f'SET search_path TO "{pg_schema}"')
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO table_cache_meta (id, last_synced_at) VALUES (2, now())")


def test_job_status_is_checked(store: MaintenanceStore, pg_database: str, pg_schema: str) -> None:
    with psycopg.connect(pg_database) as conn:
        conn.execute(f'SET search_path TO "{pg_schema}"')
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "INSERT INTO jobs (job_id, database_name, table_name, actions, dry_run, status, submitted_at)"
                " VALUES ('j', 'db', 't', '{}', false, 'bogus', now())"
            )


def test_live_jobs_view_leaves_out_soft_deleted_rows(
    store: MaintenanceStore, pg_database: str, pg_schema: str
) -> None:
    store.cache.replace_table_cache([CachedTable("db", "kept"), CachedTable("db", "gone")])
    kept = store.submit("db", "kept", ["rewrite_data_files"])
    gone = store.submit("db", "gone", ["rewrite_data_files"])
    store.queue.soft_delete(gone)
    live = _rows(pg_database, f'SELECT job_id, status FROM "{pg_schema}".live_jobs')
    assert live == [(kept, "pending")]
    assert {job.job_id for job in store.queue.list_jobs()} == {kept}
    assert {job.job_id for job in store.queue.list_jobs(include_deleted=True)} == {kept, gone}


def test_ensure_schema_is_idempotent(store: MaintenanceStore, pg_database: str, pg_schema: str) -> None:
    store.ensure_schema()
    store.ensure_schema()
    versions = _rows(
        pg_database, f'SELECT version FROM "{pg_schema}".maintenance_migrations ORDER BY version'
    )
    assert ("010",) in versions and ("011",) in versions
