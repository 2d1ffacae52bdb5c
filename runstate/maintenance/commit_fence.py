"""Fencing at the commit point: a fenced-out attempt cannot commit an Iceberg snapshot.

The queue's fences stop a zombie worker between actions, but a procedure already running would still
commit. With the JDBC catalog every Iceberg commit is a conditional UPDATE of the table's row in
`iceberg_tables`, so the check sits there: a trigger (sql/postgres/maintenance/014_commit_fence_workers.sql)
refuses the UPDATE when the connection is tagged with a worker that no longer holds the claim of the
job that locks the table.

A worker runs its jobs in one Spark session of its own (`SparkSession.newSession()`: same JVM and
SparkContext, own catalog instances) whose JDBC catalog connections carry the worker's tag as
`ApplicationName`; the claim names the worker (`job_queue.claimed_by`), so the database knows which
attempt the session works for at any moment. A worker runs one job at a time and its procedures are
synchronous, so a commit from its session always belongs to the job it claimed last: paying the
session (a catalog start, a connection pool) once per worker instead of once per job keeps the fence
as exact as a tag per attempt would.
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

    from runstate.maintenance.identifiers import TableRef

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


def worker_tag(schema: str, worker: str) -> str:
    """`application_name` of a worker session's catalog connections: the schema's part and the first 16
    hex of md5(worker), which the trigger compares with md5 of the claim's `claimed_by` (any worker
    name fits Postgres's 63-byte limit this way)."""
    return f"rsf:{schema_tag(schema)}:{hashlib.md5(worker.encode()).hexdigest()[:16]}"


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
def worker_session(spark: SparkSession, catalog: str, tag: str) -> Iterator[SparkSession]:
    """A session whose `catalog` connections carry `tag`; closes their JDBC pool afterwards.

    With a non-JDBC catalog there is nothing to tag: the base session is used as it is. The session
    keeps Iceberg's table cache (a job's figures, procedure and commit share one load of the table);
    `ActionRunner.refresh_table` brings a cached table up to date at the start of each job.
    """
    if not is_jdbc_catalog(spark, catalog):
        yield spark
        return
    session = spark.newSession()
    session.conf.set(f"spark.sql.catalog.{catalog}.jdbc.ApplicationName", tag)
    # The catalog's tables exist (the fence's trigger is on them): skip their existence checks.
    session.conf.set(f"spark.sql.catalog.{catalog}.jdbc.init-catalog-tables", "false")
    # Load the session's catalog now, through a statement (Spark makes the session active for it). A
    # first load by a direct JVM call (Spark3Util.loadIcebergTable, as the figures do) reads the conf of
    # the thread's active session, the base one: the catalog came up untagged and cached, and the
    # worker's commits passed the fence unseen. USE is the cheapest statement that loads it (no listing;
    # the session is the worker's own, so its current catalog is nobody else's).
    session.sql(f"USE {catalog}")
    try:
        yield session
    finally:
        _close_catalog(session, catalog)


def _close_catalog(session: SparkSession, catalog: str) -> None:
    """Close the session's JDBC connections now rather than when the JVM collects the catalog.

    Iceberg's table cache wraps the JDBC catalog in a CachingCatalog, which cannot be closed; the
    SparkCatalog keeps the JDBC catalog itself (private `asNamespaceCatalog`), so it is closed there.
    """
    try:
        manager = session._jsparkSession.sessionState().catalogManager()
        if not manager.isCatalogRegistered(catalog):
            return
        spark_catalog = manager.catalog(catalog)
        field = spark_catalog.getClass().getDeclaredField("asNamespaceCatalog")
        field.setAccessible(True)
        field.get(spark_catalog).close()
    except Exception:  # noqa: BLE001 - only a leak until GC; the jobs' outcomes stand
        log.warning("could not close the JDBC catalog of a worker session", exc_info=True)


def forget_table(spark: SparkSession, catalog: str, ref: TableRef) -> None:
    """Drop `spark`'s cached copy of a table a worker session committed to (its next read loads it anew).

    Straight to Iceberg's table cache: Spark's refreshTable would also resolve the name and look for
    cached relations, a few milliseconds per job for nothing a worker keeps.
    """
    try:
        manager = spark._jsparkSession.sessionState().catalogManager()
        if manager.isCatalogRegistered(catalog):
            identifier = spark.sparkContext._jvm.org.apache.iceberg.catalog.TableIdentifier.parse(ref.key)
            manager.catalog(catalog).icebergCatalog().invalidateTable(identifier)
    except Exception:  # noqa: BLE001 - the cache expires on its own; never mask the job's outcome
        log.warning("could not forget %s in the base session", ref.key, exc_info=True)
