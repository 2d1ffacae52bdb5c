"""Fencing at the commit point: a fenced-out attempt cannot commit an Iceberg snapshot.

The queue's fences stop a zombie worker between actions, but a procedure already running would still
commit. With the JDBC catalog every Iceberg commit is a conditional UPDATE of the table's row in
`iceberg_tables`, so the check sits there: a trigger (sql/postgres/maintenance/013_commit_fence.sql) refuses the
UPDATE when the connection is tagged with an attempt that no longer holds its job's fence and lock.

Each attempt runs its actions in a Spark session of its own (`SparkSession.newSession()`: same JVM
and SparkContext, own catalog instances) whose JDBC catalog connections carry the attempt's tag as
`ApplicationName`. A worker run therefore keeps one JVM across jobs while every job commits under
its own fence.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

CATALOG_TABLE = "iceberg_tables"
# Each catalog table, and whether this schema's fence trigger is already on it.
_FIND_CATALOG_TABLES = (
    "SELECT n.nspname, EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname = %s)"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.relname = %s AND c.relkind IN ('r', 'p')"
)
# CREATE TRIGGER waits for every commit in flight on the table (and every later commit queues behind
# it): never wait long, and never when the trigger is there already.
_INSTALL_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '10s'"
_INSTALL_LOCK = "SELECT pg_advisory_xact_lock(hashtext('runstate.maintenance.commit_fence'))"
_TRIGGER = (
    "CREATE OR REPLACE TRIGGER {trigger} BEFORE UPDATE ON {namespace}.{table}"
    " FOR EACH ROW EXECUTE FUNCTION {schema}.commit_fence()"
)


def schema_tag(schema: str) -> str:
    """The schema's part of the tag: the trigger of each schema only judges its own attempts."""
    return hashlib.md5(schema.encode()).hexdigest()[:8]


def attempt_tag(schema: str, attempt_id: str) -> str:
    """`application_name` of an attempt's catalog connections (under Postgres's 63-byte limit)."""
    return f"rsf:{schema_tag(schema)}:{attempt_id}"


def install_commit_fence(conn: psycopg.Connection, schema: str) -> bool:
    """Attach the schema's commit_fence() to every `iceberg_tables` of the database; False if none."""
    trigger = f"runstate_fence_{schema_tag(schema)}"
    tables = conn.execute(_FIND_CATALOG_TABLES, (trigger, CATALOG_TABLE)).fetchall()
    if not tables:
        return False
    missing = [namespace for namespace, installed in tables if not installed]
    if not missing:
        return True
    with conn.transaction():
        conn.execute(_INSTALL_LOCK)  # concurrent CREATE OR REPLACE TRIGGER on one table would collide
        conn.execute(_INSTALL_LOCK_TIMEOUT)
        for namespace in missing:
            conn.execute(
                sql.SQL(_TRIGGER).format(
                    trigger=sql.Identifier(trigger),
                    namespace=sql.Identifier(namespace),
                    table=sql.Identifier(CATALOG_TABLE),
                    schema=sql.Identifier(schema),
                )
            )
    return True


def is_jdbc_catalog(spark: SparkSession, catalog: str) -> bool:
    impl = spark.conf.get(f"spark.sql.catalog.{catalog}.catalog-impl", None) or ""
    return impl.endswith("JdbcCatalog")


@contextmanager
def attempt_session(spark: SparkSession, catalog: str, tag: str) -> Iterator[SparkSession]:
    """A session whose `catalog` connections carry `tag`; closes their JDBC pool afterwards.

    With a non-JDBC catalog there is nothing to tag: the base session is used as it is.
    """
    if not is_jdbc_catalog(spark, catalog):
        yield spark
        return
    session = spark.newSession()
    session.conf.set(f"spark.sql.catalog.{catalog}.jdbc.ApplicationName", tag)
    # No table cache: an attempt must plan against the table as it is now, not as the worker last saw it.
    session.conf.set(f"spark.sql.catalog.{catalog}.cache-enabled", "false")
    # The catalog's tables exist (the fence's trigger is on them): skip their existence checks.
    session.conf.set(f"spark.sql.catalog.{catalog}.jdbc.init-catalog-tables", "false")
    # Load the attempt's catalog now, through a statement (Spark makes the session active for it). A
    # first load by a direct JVM call (Spark3Util.loadIcebergTable, as the figures do) reads the conf of
    # the thread's active session, the base one: the catalog came up untagged and cached, and the
    # attempt's commits passed the fence unseen. USE is the cheapest statement that loads it (no listing;
    # the session is the attempt's own, so its current catalog is nobody else's).
    session.sql(f"USE {catalog}")
    try:
        yield session
    finally:
        _close_catalog(session, catalog)


def _close_catalog(session: SparkSession, catalog: str) -> None:
    """Close the attempt's JDBC connections now rather than when the JVM collects the catalog."""
    try:
        manager = session._jsparkSession.sessionState().catalogManager()
        if manager.isCatalogRegistered(catalog):
            manager.catalog(catalog).icebergCatalog().close()
    except Exception:  # noqa: BLE001 - only a leak until GC; the job's outcome stands
        log.warning("could not close the JDBC catalog of an attempt session", exc_info=True)
