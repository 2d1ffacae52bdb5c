"""The Snowflake half of the migrations: a lock table per schema, one statement per execute.

Snowflake DDL commits as it goes, so an upgrade is not one transaction: each step is idempotent
instead (IF NOT EXISTS in the files, a ledger row after each file, the legacy rows copied before
they are deleted), and an interrupted upgrade finishes on the next run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from runstate.datastore import SnowflakeDatastore
from runstate.datastore.snowflake import close_quietly
from runstate.migrations import (
    LEGACY_LEDGER,
    SNOWFLAKE_LOCK_TABLE,
    Migration,
    MigrationError,
    check_unchanged,
    ledger_table,
    legacy_rows,
    split_statements,
)

# Snowflake's "object does not exist or not authorized" (fakesnow answers a missing schema with it too).
MISSING_OBJECT_ERRNO = 2003
# Snowflake's "statement has locked table ... not yet released": a DDL that waited on another in vain.
LOCKED_ERRNO = 625


def _missing_object(exc: BaseException) -> bool:
    return getattr(exc, "errno", None) == MISSING_OBJECT_ERRNO or "does not exist" in str(exc)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


@contextmanager
def snowflake_connection(store: SnowflakeDatastore) -> Iterator[Any]:
    """A connection of the migrations' own; a failed login names the server, a failed statement the schema."""
    from snowflake.connector import errors as sf_errors

    try:
        conn = store.connect()
    except sf_errors.Error as exc:
        raise MigrationError(f"snowflake {store.where}: cannot connect: {_one_line(exc)}") from exc
    try:
        yield conn
    except sf_errors.Error as exc:
        raise MigrationError(f"snowflake {store.schema}: {_one_line(exc)}") from exc
    finally:
        close_quietly(conn)


def upgrade(
    store: SnowflakeDatastore,
    domain: str,
    migrations: list[Migration],
    *,
    session_settings: Mapping[str, str],
    lock_timeout_s: float,
) -> list[Migration]:
    """The pending files under the schema's lock table (waited for up to `lock_timeout_s`). Snowflake has
    no session settings for DDL to read: `session_settings` are not used."""
    with snowflake_connection(store) as conn:
        cur = conn.cursor()
        if _current(cur, store.schema, domain, migrations):
            return []  # the common case: no lock table, no DDL, one query
        cur.execute(f"CREATE SCHEMA IF NOT EXISTS {store.schema}")
        cur.execute(f"USE SCHEMA {store.schema}")
        with _lock(cur, store.schema, lock_timeout_s):
            return _upgrade_locked(cur, store.schema, domain, migrations)


def _current(cur: Any, schema: str, domain: str, migrations: list[Migration]) -> bool:
    """Every file recorded, unchanged, in the domain's ledger? (False for a missing ledger: lock and look.)"""
    try:
        cur.execute(f"SELECT VERSION, CHECKSUM FROM {schema}.{ledger_table(domain).upper()}")
    except Exception as exc:  # the connector's ProgrammingError
        if _missing_object(exc):
            return False
        raise
    applied = {row[0]: row[1] for row in cur.fetchall()}
    for migration in migrations:
        if migration.version not in applied:
            return False
        check_unchanged(migration, applied[migration.version])
    return True


def _held_or_transient(exc: BaseException) -> bool:
    """The lock table exists (another upgrade holds it), another DDL on it held its lock too long, or
    the server failed the CREATE (a server fault): all are worth waiting for."""
    from snowflake.connector import errors as sf_errors

    transient = (sf_errors.InternalServerError, sf_errors.ServiceUnavailableError, sf_errors.OperationalError)
    return (
        "already exists" in str(exc)
        or getattr(exc, "errno", None) == LOCKED_ERRNO
        or isinstance(exc, transient)
    )


@contextmanager
def _lock(cur: Any, schema: str, timeout_s: float) -> Iterator[None]:
    """Snowflake has no advisory locks: creating a table that must not exist yet is the mutex."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            cur.execute(f"CREATE TABLE {SNOWFLAKE_LOCK_TABLE} (TAKEN_AT TIMESTAMP_TZ)")
            break
        except Exception as exc:  # the connector's errors: "already exists" means "held"
            if not _held_or_transient(exc) or time.monotonic() > deadline:
                raise MigrationError(
                    f"snowflake {schema}: the migration lock is held ({exc}); if no upgrade is running, "
                    f"DROP TABLE {schema}.{SNOWFLAKE_LOCK_TABLE}"
                ) from exc
            time.sleep(0.5)
    try:
        yield
    finally:
        cur.execute(f"DROP TABLE IF EXISTS {SNOWFLAKE_LOCK_TABLE}")


def _upgrade_locked(cur: Any, schema: str, domain: str, migrations: list[Migration]) -> list[Migration]:
    ledger = ledger_table(domain).upper()
    cur.execute(
        f"CREATE TABLE IF NOT EXISTS {ledger} ("
        " VERSION VARCHAR PRIMARY KEY, NAME VARCHAR NOT NULL, CHECKSUM VARCHAR NOT NULL,"
        " APPLIED_AT TIMESTAMP_TZ DEFAULT CURRENT_TIMESTAMP())"
    )
    _adopt_legacy(cur, schema, ledger, migrations)
    cur.execute(f"SELECT VERSION, CHECKSUM FROM {ledger}")
    applied = {row[0]: row[1] for row in cur.fetchall()}
    done = []
    for migration in migrations:
        if migration.version in applied:
            check_unchanged(migration, applied[migration.version])
            continue
        for statement in split_statements(migration.text):
            cur.execute(statement)
        cur.execute(
            f"INSERT INTO {ledger} (VERSION, NAME, CHECKSUM) VALUES (%s, %s, %s)",
            (migration.version, migration.name, migration.checksum),
        )
        done.append(migration)
    return done


def _table_exists(cur: Any, schema: str, table: str) -> bool:
    cur.execute(
        "SELECT COUNT(*) FROM INFORMATION_SCHEMA.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
        (schema.upper(), table.upper()),
    )
    return bool(cur.fetchone()[0])


def _adopt_legacy(cur: Any, schema: str, ledger: str, migrations: list[Migration]) -> None:
    """Copy this domain's rows of the old shared ledger (unchanged), then delete them; drop it once empty."""
    legacy = LEGACY_LEDGER.upper()
    if not _table_exists(cur, schema, legacy):
        return
    rows = legacy_rows(migrations)
    mine = " OR ".join(["(VERSION = %s AND NAME = %s)"] * len(rows))
    params = [value for row in rows for value in row]
    cur.execute(
        f"INSERT INTO {ledger} (VERSION, NAME, CHECKSUM, APPLIED_AT)"
        f" SELECT VERSION, NAME, CHECKSUM, APPLIED_AT FROM {legacy} l WHERE ({mine})"
        f" AND NOT EXISTS (SELECT 1 FROM {ledger} d WHERE d.VERSION = l.VERSION)",
        params,
    )
    cur.execute(f"DELETE FROM {legacy} WHERE {mine}", params)
    cur.execute(f"SELECT COUNT(*) FROM {legacy}")
    if not cur.fetchone()[0]:
        cur.execute(f"DROP TABLE {legacy}")


def applied(store: SnowflakeDatastore, domain: str, migrations: list[Migration], *, pooled: bool) -> set[str]:
    """The domain's applied versions: its ledger, plus its rows still in the old shared ledger."""
    if pooled:
        from snowflake.connector import errors as sf_errors

        try:
            with store.cursor() as cur:
                return _read_applied(cur, store.schema, domain, migrations)
        except sf_errors.ProgrammingError as exc:
            if not _missing_object(exc):
                raise MigrationError(f"snowflake {store.schema}: {_one_line(exc)}") from exc
            return set()  # the schema itself is missing: USE SCHEMA failed
        except sf_errors.Error as exc:
            raise MigrationError(f"snowflake {store.where}: {_one_line(exc)}") from exc
    with snowflake_connection(store) as conn:
        return _read_applied(conn.cursor(), store.schema, domain, migrations)


def _read_applied(cur: Any, schema: str, domain: str, migrations: list[Migration]) -> set[str]:
    ledger = f"{schema}.{ledger_table(domain).upper()}"
    try:
        cur.execute(f"SELECT VERSION FROM {ledger}")
        return {row[0] for row in cur.fetchall()}
    except Exception as exc:  # the connector's ProgrammingError: no ledger yet (an old or a new schema)
        if not _missing_object(exc):
            raise
    if not _table_exists(cur, schema, LEGACY_LEDGER):
        return set()
    cur.execute(f"SELECT VERSION, NAME FROM {schema}.{LEGACY_LEDGER.upper()}")
    mine = set(legacy_rows(migrations))
    return {version for version, name in cur.fetchall() if (version, name) in mine}
