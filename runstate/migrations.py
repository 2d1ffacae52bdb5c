"""Versioned DDL from `sql/<backend>/NNN_name.sql`, applied once each and recorded.

Every file is applied inside the target schema (search_path on Postgres, USE SCHEMA on
Snowflake), so one set of files serves any number of schemas. On Postgres the whole upgrade
holds a transaction-scoped advisory lock, so two processes upgrading at once serialise and the
second finds nothing left to do.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

SQL_ROOT = Path(__file__).resolve().parent.parent / "sql"
_FILE_RE = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
_SCHEMA_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
SNOWFLAKE_LOCK_TABLE = "SCHEMA_MIGRATIONS_LOCK"


class MigrationError(RuntimeError):
    """A migration cannot be discovered, applied or checked; the message names the file or the server."""


class InvalidSchemaName(MigrationError, ValueError):
    """A schema name that would have to be quoted; refused before any SQL runs."""


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    path: Path

    @property
    def text(self) -> str:
        return self.path.read_text()

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class MigrationStatus:
    version: str
    name: str
    applied: bool


def discover(backend: str) -> list[Migration]:
    folder = SQL_ROOT / backend
    found = []
    for path in sorted(folder.glob("*.sql")):
        match = _FILE_RE.match(path.name)
        if not match:
            raise MigrationError(f"{path}: migration files are named NNN_snake_name.sql")
        found.append(Migration(match.group(1), match.group(2), path))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"sql/{backend}: two migration files share a version number")
    return found


def check_schema_name(schema: str) -> str:
    if not isinstance(schema, str) or not _SCHEMA_RE.fullmatch(schema):
        raise InvalidSchemaName(f"schema name {schema!r} must match {_SCHEMA_RE.pattern}")
    return schema


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return url


@contextmanager
def postgres_errors(dsn: str) -> Iterator[None]:
    """A driver error (server down, wrong database, failing DDL) is a MigrationError naming the server."""
    try:
        yield
    except psycopg.Error as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise MigrationError(f"postgres {redact(dsn)}: {detail}") from exc


def _lock_key(schema: str) -> int:
    return int.from_bytes(
        hashlib.sha256(f"runstate.migrate.{schema}".encode()).digest()[:8], "big", signed=True
    )


def _postgres_bootstrap(cur: psycopg.Cursor, schema: str) -> None:
    cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    cur.execute(sql.SQL("SET LOCAL search_path TO {}, public").format(sql.Identifier(schema)))
    cur.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version TEXT PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL,"
        " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    )


def _applied_postgres(cur: psycopg.Cursor) -> dict[str, str]:
    cur.execute("SELECT version, checksum FROM schema_migrations")
    return dict(cur.fetchall())


def upgrade_postgres(dsn: str, schema: str = "runstate") -> list[Migration]:
    """Apply every pending Postgres migration into `schema`; returns what was applied."""
    check_schema_name(schema)
    pending: list[Migration] = []
    with postgres_errors(dsn), psycopg.connect(dsn) as conn, conn.cursor() as cur:
        # Advisory lock before CREATE SCHEMA: concurrent CREATE SCHEMA IF NOT EXISTS can still collide.
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(schema),))
        _postgres_bootstrap(cur, schema)
        applied = _applied_postgres(cur)
        for migration in discover("postgres"):
            if migration.version in applied:
                _check_unchanged(migration, applied[migration.version])
                continue
            cur.execute(migration.text)
            cur.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (migration.version, migration.name, migration.checksum),
            )
            pending.append(migration)
    return pending


def status_postgres(dsn: str, schema: str = "runstate") -> list[MigrationStatus]:
    check_schema_name(schema)
    with postgres_errors(dsn), psycopg.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (f"{schema}.schema_migrations",))
        exists = cur.fetchone()[0] is not None
        applied = {}
        if exists:
            cur.execute(
                sql.SQL("SELECT version, checksum FROM {}.schema_migrations").format(sql.Identifier(schema))
            )
            applied = dict(cur.fetchall())
    return [MigrationStatus(m.version, m.name, m.version in applied) for m in discover("postgres")]


def _check_unchanged(migration: Migration, recorded_checksum: str) -> None:
    if recorded_checksum != migration.checksum:
        raise MigrationError(
            f"migration {migration.path.name} was edited after it was applied "
            f"(recorded sha256 {recorded_checksum[:12]}.., file {migration.checksum[:12]}..); "
            "add a new file instead"
        )


def upgrade_snowflake(
    conn: Any, schema: str = "RUNSTATE", *, lock_timeout_s: float = 300.0
) -> list[Migration]:
    """Apply pending Snowflake migrations through a DB-API connection from snowflake-connector."""
    check_schema_name(schema)
    cur = conn.cursor()
    cur.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    cur.execute(f"USE SCHEMA {schema}")
    with _snowflake_lock(cur, schema, lock_timeout_s):
        return _upgrade_snowflake_locked(cur)


@contextmanager
def _snowflake_lock(cur: Any, schema: str, timeout_s: float = 300.0) -> Iterator[None]:
    """Snowflake has no advisory locks: creating a table that must not exist yet is the mutex."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            cur.execute(f"CREATE TABLE {SNOWFLAKE_LOCK_TABLE} (TAKEN_AT TIMESTAMP_TZ)")
            break
        except Exception as exc:  # the connector's ProgrammingError; only "already exists" means "held"
            if "already exists" not in str(exc) or time.monotonic() > deadline:
                raise MigrationError(
                    f"snowflake {schema}: the migration lock is held ({exc}); if no upgrade is running, "
                    f"DROP TABLE {schema}.{SNOWFLAKE_LOCK_TABLE}"
                ) from exc
            time.sleep(0.5)
    try:
        yield
    finally:
        cur.execute(f"DROP TABLE IF EXISTS {SNOWFLAKE_LOCK_TABLE}")


def _upgrade_snowflake_locked(cur: Any) -> list[Migration]:
    cur.execute(
        "CREATE TABLE IF NOT EXISTS SCHEMA_MIGRATIONS ("
        " VERSION VARCHAR PRIMARY KEY, NAME VARCHAR NOT NULL, CHECKSUM VARCHAR NOT NULL,"
        " APPLIED_AT TIMESTAMP_TZ DEFAULT CURRENT_TIMESTAMP())"
    )
    cur.execute("SELECT VERSION, CHECKSUM FROM SCHEMA_MIGRATIONS")
    applied = {row[0]: row[1] for row in cur.fetchall()}
    done = []
    for migration in discover("snowflake"):
        if migration.version in applied:
            _check_unchanged(migration, applied[migration.version])
            continue
        for statement in split_statements(migration.text):
            cur.execute(statement)
        cur.execute(
            "INSERT INTO SCHEMA_MIGRATIONS (VERSION, NAME, CHECKSUM) VALUES (%s, %s, %s)",
            (migration.version, migration.name, migration.checksum),
        )
        done.append(migration)
    return done


def status_snowflake(conn: Any, schema: str = "RUNSTATE") -> list[MigrationStatus]:
    check_schema_name(schema)
    cur = conn.cursor()
    applied: set[str] = set()
    cur.execute(
        "SELECT COUNT(*) FROM INFORMATION_SCHEMA.TABLES"
        " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 'SCHEMA_MIGRATIONS'",
        (schema.upper(),),
    )
    if cur.fetchone()[0]:
        cur.execute(f"SELECT VERSION FROM {schema}.SCHEMA_MIGRATIONS")
        applied = {row[0] for row in cur.fetchall()}
    return [MigrationStatus(m.version, m.name, m.version in applied) for m in discover("snowflake")]


def split_statements(text: str) -> list[str]:
    """Split on `;` at line ends; Snowflake's connector runs one statement per execute."""
    lines = [line for line in text.splitlines() if not line.strip().startswith("--")]
    statements = (stmt.strip().rstrip(";").strip() for stmt in ("\n".join(lines) + "\n").split(";\n"))
    return [stmt for stmt in statements if stmt]
