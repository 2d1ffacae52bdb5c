"""The Postgres half of the migrations: one transaction per upgrade, under an advisory lock per schema."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import psycopg
from psycopg import sql

from runstate.datastore import PostgresDatastore, redact
from runstate.migrations import (
    LEGACY_LEDGER,
    Migration,
    MigrationError,
    check_unchanged,
    ledger_table,
    legacy_rows,
)


@contextmanager
def postgres_errors(store: PostgresDatastore) -> Iterator[None]:
    """A driver error (server down, wrong database, failing DDL) is a MigrationError naming the server."""
    try:
        yield
    except psycopg.Error as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise MigrationError(f"postgres {redact(store.dsn)}: {detail}") from exc


def _lock_key(schema: str) -> int:
    # The same key for every domain: CREATE SCHEMA IF NOT EXISTS can collide between any two upgrades.
    return int.from_bytes(
        hashlib.sha256(f"runstate.migrate.{schema}".encode()).digest()[:8], "big", signed=True
    )


def upgrade_postgres(
    store: PostgresDatastore, domain: str, migrations: list[Migration], session_settings: Mapping[str, str]
) -> list[Migration]:
    with postgres_errors(store), store.connect() as conn:
        if _current(conn, store.schema, domain, migrations):
            return []  # the common case: no lock, no DDL, one query
        return _upgrade_locked(conn, store.schema, domain, migrations, session_settings)


def _current(conn: psycopg.Connection, schema: str, domain: str, migrations: list[Migration]) -> bool:
    """Every file recorded, unchanged, in the domain's ledger? (False for a missing ledger: lock and look.)"""
    try:
        rows = conn.execute(
            sql.SQL("SELECT version, checksum FROM {}").format(sql.Identifier(schema, ledger_table(domain)))
        ).fetchall()
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        return False
    applied = dict(rows)
    for migration in migrations:
        if migration.version not in applied:
            return False
        check_unchanged(migration, applied[migration.version])
    return True


def _upgrade_locked(
    conn: psycopg.Connection,
    schema_name: str,
    domain: str,
    migrations: list[Migration],
    session_settings: Mapping[str, str],
) -> list[Migration]:
    done: list[Migration] = []
    schema = sql.Identifier(schema_name)
    ledger = sql.Identifier(schema_name, ledger_table(domain))
    with conn.transaction(), conn.cursor() as cur:
        # The lock before CREATE SCHEMA: concurrent CREATE SCHEMA IF NOT EXISTS can still collide.
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(schema_name),))
        cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
        cur.execute(sql.SQL("SET LOCAL search_path TO {}, public").format(schema))
        for name, value in session_settings.items():
            cur.execute("SELECT set_config(%s, %s, true)", (name, str(value)))
        cur.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (version TEXT PRIMARY KEY, name TEXT NOT NULL,"
                " checksum TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            ).format(ledger)
        )
        _adopt_legacy(cur, schema_name, ledger, migrations)
        cur.execute(sql.SQL("SELECT version, checksum FROM {}").format(ledger))
        applied = dict(cur.fetchall())
        for migration in migrations:
            if migration.version in applied:
                check_unchanged(migration, applied[migration.version])
                continue
            cur.execute(migration.text)
            cur.execute(
                sql.SQL("INSERT INTO {} (version, name, checksum) VALUES (%s, %s, %s)").format(ledger),
                (migration.version, migration.name, migration.checksum),
            )
            done.append(migration)
    return done


def _adopt_legacy(
    cur: psycopg.Cursor, schema: str, ledger: sql.Identifier, migrations: list[Migration]
) -> None:
    """Move this domain's rows of the old shared ledger into its own, unchanged; drop the old one when empty."""
    legacy = sql.Identifier(schema, LEGACY_LEDGER)
    cur.execute("SELECT to_regclass(%s)", (f"{schema}.{LEGACY_LEDGER}",))
    if cur.fetchone()[0] is None:
        return
    versions, names = (list(column) for column in zip(*legacy_rows(migrations)))
    mine = sql.SQL("(version, name) IN (SELECT * FROM unnest(%s::text[], %s::text[]))")
    cur.execute(
        sql.SQL(
            "INSERT INTO {} (version, name, checksum, applied_at)"
            " SELECT version, name, checksum, applied_at FROM {} WHERE {} ON CONFLICT (version) DO NOTHING"
        ).format(ledger, legacy, mine),
        (versions, names),
    )
    cur.execute(sql.SQL("DELETE FROM {} WHERE {}").format(legacy, mine), (versions, names))
    cur.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(legacy))
    if not cur.fetchone()[0]:
        cur.execute(sql.SQL("DROP TABLE {}").format(legacy))


def applied_postgres(
    store: PostgresDatastore, domain: str, migrations: list[Migration], *, pooled: bool
) -> set[str]:
    """The domain's applied versions: its ledger, plus its rows still in the old shared ledger."""
    with postgres_errors(store):
        if pooled:
            with store.connection() as conn:
                return _read_applied(conn, store.schema, domain, migrations)
        with store.connect() as conn:
            return _read_applied(conn, store.schema, domain, migrations)


def _read_applied(
    conn: psycopg.Connection, schema: str, domain: str, migrations: list[Migration]
) -> set[str]:
    # The common case is one query; a missing ledger (an old or a new schema) costs a second.
    try:
        rows = conn.execute(
            sql.SQL("SELECT version FROM {}").format(sql.Identifier(schema, ledger_table(domain)))
        )
        return {row[0] for row in rows.fetchall()}
    except psycopg.errors.UndefinedTable:
        pass
    except psycopg.errors.InvalidSchemaName:
        return set()
    found = conn.execute("SELECT to_regclass(%s)", (f"{schema}.{LEGACY_LEDGER}",)).fetchone()[0]
    if found is None:
        return set()
    rows = conn.execute(
        sql.SQL("SELECT version, name FROM {}").format(sql.Identifier(schema, LEGACY_LEDGER))
    ).fetchall()
    mine = set(legacy_rows(migrations))
    return {version for version, name in rows if (version, name) in mine}
