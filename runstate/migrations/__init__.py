"""Versioned DDL from `sql/<backend>/<domain>/NNN_name.sql`, applied once each, per domain.

Each domain (eventstore, maintenance) has its own folder and its own ledger, the table
`<domain>_migrations` in the target schema, so upgrading one domain never creates another's
tables. Every file is applied inside the target schema (search_path on Postgres, USE SCHEMA on
Snowflake), so one set of files serves any number of schemas. An upgrade holds one lock per schema
(a transaction-scoped advisory lock on Postgres; a lock table on Snowflake, which has no advisory
locks): two processes upgrading at once serialise and the second finds nothing left to do.

Deployments made before the per-domain ledgers recorded every file in one table, `schema_migrations`.
An upgrade moves the rows of its domain's files (version, name, checksum, applied_at unchanged) into
the domain's ledger and drops the old table once it is empty; until then, status and
`require_current` read it too.

A Postgres migration that moves many rows runs in batches, so that a killed upgrade resumes where it
stopped instead of starting over (Migration.sections): the part before a `-- migrate: repeat` line is
applied in the upgrade's transaction and must be safe to apply again; each `-- migrate: repeat` statement
then runs in a transaction of its own, again and again, until it returns 0 (the rows it moved); the part
after `-- migrate: finally` commits together with the migration's ledger row. Until then the migration is
pending: `require_current` refuses the schema, and the next upgrade applies the first part again and
carries on with the batches.

Only `runstate db upgrade` and `runstate services up` (and a store's own `ensure_schema()`, which tests
and the Dagster resources call) migrate. An upgrade first reads the domain's ledger without any lock:
a current schema costs one query, so concurrent callers never queue on the migration lock. The CLI's
other verbs call `require_current`: one query, and an error telling the user to upgrade when the
schema is behind the installed files.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from types import ModuleType
from typing import TYPE_CHECKING

from runstate import sqlfiles
from runstate.datastore.names import InvalidSchemaName, check_schema_name

if TYPE_CHECKING:
    from runstate.datastore import Datastore

__all__ = [
    "InvalidSchemaName",
    "Migration",
    "MigrationError",
    "MigrationStatus",
    "SchemaNotCurrent",
    "check_schema_name",
    "discover",
    "domains",
    "require_current",
    "status",
    "upgrade",
    "upgrade_all",
]

REPEAT_LINE = "-- migrate: repeat"
FINALLY_LINE = "-- migrate: finally"
_FILE_RE = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
_DOMAIN_RE = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
LEGACY_LEDGER = "schema_migrations"
SNOWFLAKE_LOCK_TABLE = "SCHEMA_MIGRATIONS_LOCK"


class MigrationError(RuntimeError):
    """A migration cannot be discovered, applied or checked; the message names the file or the server."""


class SchemaNotCurrent(MigrationError):
    """The schema lacks migrations this runstate ships: run `runstate db upgrade`."""


@dataclass(frozen=True)
class Migration:
    backend: str
    domain: str
    version: str
    name: str
    resource: Traversable

    @property
    def where(self) -> str:
        return f"sql/{self.backend}/{self.domain}/{self.resource.name}"

    @property
    def text(self) -> str:
        return self.resource.read_text(encoding="utf-8")

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.resource.read_bytes()).hexdigest()

    @property
    def sections(self) -> Sections:
        """The file split at its `-- migrate: repeat` and `-- migrate: finally` lines."""
        parts: list[tuple[str, list[str]]] = [("", [])]
        for line in self.text.splitlines(keepends=True):
            if line.strip() in (REPEAT_LINE, FINALLY_LINE):
                parts.append((line.strip(), []))
            else:
                parts[-1][1].append(line)
        marks = [mark for mark, _ in parts[1:]]
        texts = ["".join(lines) for _, lines in parts]
        if FINALLY_LINE in marks[:-1] or any(not _code(text) for text in texts[1:]):
            raise MigrationError(
                f"migration {self.where}: each `{REPEAT_LINE}` needs one statement, and "
                f"`{FINALLY_LINE}` comes once, last, with statements"
            )
        repeats = [text.strip().rstrip(";") for mark, text in zip(marks, texts[1:]) if mark == REPEAT_LINE]
        finish = texts[-1] if marks[-1:] == [FINALLY_LINE] else ""
        return Sections(texts[0], repeats, finish)


@dataclass(frozen=True)
class Sections:
    """A migration's parts: `prepare` in the upgrade's transaction, each of `repeats` in transactions of
    its own until it returns 0, `finish` with the ledger row (only `prepare` for a plain migration)."""

    prepare: str
    repeats: list[str]
    finish: str


def _code(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith("--")).strip()


@dataclass(frozen=True)
class MigrationStatus:
    domain: str
    version: str
    name: str
    applied: bool


def domains(backend: str) -> list[str]:
    """The domains with SQL for `backend` (each has its own ledger)."""
    with _sql_errors():
        return sqlfiles.domains(backend)


def discover(backend: str, domain: str) -> list[Migration]:
    """The domain's migrations in version order; a missing folder or a misnamed file is an error."""
    if not _DOMAIN_RE.fullmatch(domain):
        raise MigrationError(f"domain name {domain!r} must match {_DOMAIN_RE.pattern}")
    found = []
    with _sql_errors():
        files = list(sqlfiles.sql_files(backend, domain))
    for resource in files:
        if not resource.name[:1].isdigit():
            continue  # a file of named queries (append.sql, queue.sql, ...), not a migration
        match = _FILE_RE.match(resource.name)
        if not match:
            raise MigrationError(
                f"sql/{backend}/{domain}/{resource.name}: migration files are named NNN_snake_name.sql"
            )
        found.append(Migration(backend, domain, match.group(1), match.group(2), resource))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"sql/{backend}/{domain}: two migration files share a version number")
    if not found:
        raise MigrationError(f"sql/{backend}/{domain}: no migration files in the installed runstate")
    return found


def ledger_table(domain: str) -> str:
    return f"{domain}_migrations"


def upgrade(
    store: Datastore,
    domain: str,
    *,
    session_settings: Mapping[str, str] | None = None,
    lock_timeout_s: float = 300.0,
) -> list[Migration]:
    """Apply the domain's pending migrations into the store's schema; returns what was applied.

    `session_settings` (Postgres) are set for the upgrade's transaction, for DDL that reads them
    (`runstate.event_partitions`, say)."""
    backend = _backend_migrations(store)
    if backend is None:
        return []
    migrations = discover(store.backend, domain)
    return backend.upgrade(
        store, domain, migrations, session_settings=session_settings or {}, lock_timeout_s=lock_timeout_s
    )


def upgrade_all(store: Datastore) -> dict[str, list[Migration]]:
    """Every domain's pending migrations (`runstate db upgrade`, `services up`): {domain: applied}."""
    if _backend_migrations(store) is None:
        return {}
    return {domain: upgrade(store, domain) for domain in domains(store.backend)}


def status(store: Datastore, domain: str) -> list[MigrationStatus]:
    """Each of the domain's migrations and whether the schema has it."""
    if _backend_migrations(store) is None:
        return []
    migrations = discover(store.backend, domain)
    applied = _applied(store, domain, migrations, pooled=False)
    return [MigrationStatus(domain, m.version, m.name, m.version in applied) for m in migrations]


def require_current(store: Datastore, domain: str, *, pooled: bool = True) -> None:
    """Raise SchemaNotCurrent unless every shipped migration of the domain is applied; never migrates.

    One query when the schema is current: on a pooled connection, or (`pooled=False`, for a caller that
    opens no pool) on one of its own. A schema ahead of the files (a newer runstate upgraded it) is
    accepted: migrations only add. A backend that keeps no schema is always current."""
    if _backend_migrations(store) is None:
        return
    migrations = discover(store.backend, domain)
    applied = _applied(store, domain, migrations, pooled=pooled)
    missing = [m for m in migrations if m.version not in applied]
    if not missing:
        return
    where = f"{store.backend} schema {store.schema}"
    if len(missing) == len(migrations):
        raise SchemaNotCurrent(f"{where}: the {domain} tables are not set up; run `runstate db upgrade`")
    names = ", ".join(f"{m.version}_{m.name}" for m in missing)
    raise SchemaNotCurrent(f"{where}: {domain} migration(s) {names} not applied; run `runstate db upgrade`")


def _applied(store: Datastore, domain: str, migrations: list[Migration], *, pooled: bool) -> set[str]:
    return _backend_migrations(store).applied(store, domain, migrations, pooled=pooled)


def _backend_migrations(store: Datastore) -> ModuleType | None:
    """The module applying the store's backend's files (runstate.backends); None: it keeps no schema."""
    from runstate import backends

    return backends.get(store.backend).migrations_module()


def check_unchanged(migration: Migration, recorded_checksum: str) -> None:
    if recorded_checksum != migration.checksum:
        raise MigrationError(
            f"migration {migration.where} was edited after it was applied "
            f"(recorded sha256 {recorded_checksum[:12]}.., file {migration.checksum[:12]}..); "
            "add a new file instead"
        )


def legacy_rows(migrations: list[Migration]) -> list[tuple[str, str]]:
    """(version, name) of the domain's files: the rows of the old shared ledger that belong to it."""
    return [(m.version, m.name) for m in migrations]


@contextmanager
def _sql_errors() -> Iterator[None]:
    try:
        yield
    except sqlfiles.SqlFileError as exc:
        raise MigrationError(str(exc)) from exc


def split_statements(text: str) -> list[str]:
    """Split on `;` at line ends; Snowflake's connector runs one statement per execute."""
    lines = [line for line in text.splitlines() if not line.strip().startswith("--")]
    statements = (stmt.strip().rstrip(";").strip() for stmt in ("\n".join(lines) + "\n").split(";\n"))
    return [stmt for stmt in statements if stmt]
