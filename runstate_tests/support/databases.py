"""Postgres databases of a test's own on the test server (RUNSTATE_TEST_PG_ADMIN_URL)."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import psycopg
import psycopg.errors
from psycopg import sql

ADMIN_URL = os.environ.get("RUNSTATE_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def database_url(database: str, admin_url: str = ADMIN_URL) -> str:
    """The URL of `database` on the admin URL's server."""
    base, _, _ = admin_url.rpartition("/")
    return f"{base}/{database}"


def create_database(name: str) -> str:
    """An empty database `name`; returns its URL."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return database_url(name)


def drop_database(name: str) -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# A database whose schema MIGRATED_SCHEMA holds every shipped migration (as `runstate db upgrade` leaves
# it) is copied from a template migrated once: CREATE DATABASE ... TEMPLATE copies it in about the time
# an empty CREATE DATABASE takes, where migrating a new database again cost as much once more. The
# template's name carries a digest of the migrations and of the code that applies them, so a changed
# file makes a new template and an unchanged checkout reuses the one on the server.
MIGRATED_SCHEMA = "runstate"
TEMPLATE_PREFIX = "rs_template_"
# Postgres refuses a TEMPLATE that any session is connected to; the template takes no connections
# at all once built, so no test, worker or stray client can block the copies.
_TEMPLATE_LOCK_KEY = 0x7273_7470_6C00  # serialises the template's build across workers and sessions


def migrations_digest() -> str:
    """sha256 of the shipped Postgres migrations (every domain, name and content) and of the modules
    that apply them: what a database migrated by this checkout holds."""
    from pathlib import Path

    import runstate.migrations
    from runstate import migrations

    digest = hashlib.sha256(MIGRATED_SCHEMA.encode())
    for domain in migrations.domains("postgres"):
        for migration in migrations.discover("postgres", domain):
            digest.update(f"{migration.where}\0{migration.checksum}\0".encode())
    for module in sorted(Path(runstate.migrations.__file__).parent.glob("*.py")):
        digest.update(module.name.encode() + b"\0" + module.read_bytes())
    return digest.hexdigest()[:16]


def migrated_template() -> str:
    """The name of the template database of this checkout's migrations, built now if the server lacks it.

    Built under a session advisory lock, so parallel workers and sessions build it once; built under a
    name of its own and renamed only when migrated and without connections, so a template of this name
    is always complete."""
    name = TEMPLATE_PREFIX + migrations_digest()
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        if _exists(admin, name):
            return name
        admin.execute("SELECT pg_advisory_lock(%s)", (_TEMPLATE_LOCK_KEY,))
        try:
            if not _exists(admin, name):
                _build_template(admin, name)
        finally:
            admin.execute("SELECT pg_advisory_unlock(%s)", (_TEMPLATE_LOCK_KEY,))
    return name


def create_migrated_database(name: str) -> str:
    """A database `name` whose schema MIGRATED_SCHEMA is migrated, copied from `migrated_template()`."""
    template = migrated_template()
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
        )
    return database_url(name)


def _exists(admin: psycopg.Connection, name: str) -> bool:
    return admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def _build_template(admin: psycopg.Connection, name: str) -> None:
    from runstate import migrations
    from runstate.datastore.postgres import PostgresDatastore

    building = unique(f"{TEMPLATE_PREFIX}building")
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
    try:
        datastore = PostgresDatastore(database_url(building), schema=MIGRATED_SCHEMA)
        try:
            migrations.upgrade_all(datastore)
        finally:
            datastore.close()
        # No session may be left on it (a pool's connection closing late); none may open one again.
        admin.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(sql.Identifier(building))
        )
        rename = sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
            sql.Identifier(building), sql.Identifier(name)
        )
        for attempt in range(50):
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (building,)
            )
            try:
                admin.execute(rename)
                break
            except psycopg.errors.ObjectInUse:  # a terminated backend still exiting
                if attempt == 49:
                    raise
                time.sleep(0.1)
        admin.execute(sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE true").format(sql.Identifier(name)))
    except BaseException:
        drop_database(building)
        raise


class DatabasesMadeAhead:
    """Databases made one ahead, in a thread of their own: a test takes the database made while the test
    before it ran, and its database is dropped in that thread too. A CREATE DATABASE (about 0.3 s, mostly
    the server's fsync of each new relation file, a template's copy as much as an empty one) then stays
    off the tests' path."""

    def __init__(self, prefix: str, create: Callable[[str], str]) -> None:
        self.prefix, self.create = prefix, create
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"{prefix}-databases")
        self._next: Future[tuple[str, str]] | None = None

    def take(self) -> tuple[str, str]:
        """(name, URL) of a database of the caller's own; it gives it back with `drop`."""
        ready = self._next or self._make()
        self._next = None
        name, url = ready.result()
        self._next = self._make()
        return name, url

    def drop(self, name: str) -> None:
        self._thread.submit(drop_database, name)

    def close(self) -> None:
        if self._next is not None:
            self._next.add_done_callback(lambda made: made.exception() or drop_database(made.result()[0]))
        self._thread.shutdown(wait=True)

    def _make(self) -> Future[tuple[str, str]]:
        name = unique(self.prefix)
        return self._thread.submit(lambda: (name, self.create(name)))
