"""The Postgres half of the migrations: one transaction per upgrade (and one per batch of a batched
migration), under an advisory lock per schema."""

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


def upgrade(
    store: PostgresDatastore,
    domain: str,
    migrations: list[Migration],
    *,
    session_settings: Mapping[str, str],
    lock_timeout_s: float,
) -> list[Migration]:
    """The pending files under the schema's advisory lock (a session lock: it waits for the holder, however
    long, so `lock_timeout_s` does not apply)."""
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
    """Apply the pending files in one transaction, up to a batched one (Migration.sections): its first
    part commits with the files before it, each batch commits alone, and its last part commits with its
    ledger row and the files after it. A session lock, held across those transactions, keeps other
    upgraders out until the end (or until this process dies)."""
    done: list[Migration] = []
    with _schema_lock(conn, schema_name):
        while True:
            with conn.transaction(), conn.cursor() as cur:
                ledger = _enter_schema(cur, schema_name, domain, migrations, session_settings)
                cur.execute(sql.SQL("SELECT version, checksum FROM {}").format(ledger))
                applied = dict(cur.fetchall())
                batched = None
                for migration in migrations:
                    if migration.version in applied:
                        check_unchanged(migration, applied[migration.version])
                        continue
                    sections = migration.sections
                    cur.execute(sections.prepare)
                    if sections.repeats:
                        batched = migration  # its batches commit on their own, after this transaction
                        break
                    _record(cur, ledger, migration)
                    done.append(migration)
            if batched is None:
                return done
            for statement in batched.sections.repeats:
                _repeat(conn, schema_name, statement, session_settings)
            with conn.transaction(), conn.cursor() as cur:
                ledger = _enter_schema(cur, schema_name, domain, migrations, session_settings)
                if batched.sections.finish.strip():
                    cur.execute(batched.sections.finish)
                _record(cur, ledger, batched)
                done.append(batched)


@contextmanager
def _schema_lock(conn: psycopg.Connection, schema: str) -> Iterator[None]:
    # Taken before CREATE SCHEMA: concurrent CREATE SCHEMA IF NOT EXISTS can still collide.
    conn.execute("SELECT pg_advisory_lock(%s)", (_lock_key(schema),))
    try:
        yield
    finally:
        if not conn.closed and not conn.broken:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_lock_key(schema),))


def _enter_schema(
    cur: psycopg.Cursor,
    schema_name: str,
    domain: str,
    migrations: list[Migration],
    session_settings: Mapping[str, str],
) -> sql.Identifier:
    """In the transaction: the schema, its search_path and settings, and the domain's ledger (returned)."""
    schema = sql.Identifier(schema_name)
    ledger = sql.Identifier(schema_name, ledger_table(domain))
    cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
    _set_session(cur, schema_name, session_settings)
    cur.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (version TEXT PRIMARY KEY, name TEXT NOT NULL,"
            " checksum TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        ).format(ledger)
    )
    _adopt_legacy(cur, schema_name, ledger, migrations)
    return ledger


def _set_session(cur: psycopg.Cursor, schema_name: str, session_settings: Mapping[str, str]) -> None:
    cur.execute(sql.SQL("SET LOCAL search_path TO {}, public").format(sql.Identifier(schema_name)))
    for name, value in session_settings.items():
        cur.execute("SELECT set_config(%s, %s, true)", (name, str(value)))


def _record(cur: psycopg.Cursor, ledger: sql.Identifier, migration: Migration) -> None:
    cur.execute(
        sql.SQL("INSERT INTO {} (version, name, checksum) VALUES (%s, %s, %s)").format(ledger),
        (migration.version, migration.name, migration.checksum),
    )


def _repeat(
    conn: psycopg.Connection, schema_name: str, statement: str, session_settings: Mapping[str, str]
) -> None:
    """Run `statement` in a transaction of its own until it returns 0: each batch that commits stays done."""
    while True:
        with conn.transaction(), conn.cursor() as cur:
            _set_session(cur, schema_name, session_settings)
            if not cur.execute(statement).fetchone()[0]:
                return


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


def applied(store: PostgresDatastore, domain: str, migrations: list[Migration], *, pooled: bool) -> set[str]:
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
