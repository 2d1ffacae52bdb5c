"""Holding a maintenance worker at its Iceberg commit, for the fence tests (maintenance/ and cluster/)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg

from runstate.maintenance.commit_fence import schema_tag
from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.store import MaintenanceStore
from runstate_tests.support.databases import unique
from runstate_tests.support.maintenance import cache, make_table, rows, sql

REACH_COMMIT_SECONDS = 900.0  # a worker JVM starting on a shared, loaded machine


@dataclass
class CommitHold:
    dsn: str
    name: str
    key: int
    holder: psycopg.Connection

    def let_through(self, tag: str) -> None:
        sql(self.dsn, f"INSERT INTO public.{self.name}_free VALUES (%s)", tag)

    def release(self) -> None:
        if not self.holder.closed:
            self.holder.close()

    def waiting(self, tag: str) -> bool:
        query = (
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'"
            " AND application_name = %s"
        )
        return sql(self.dsn, query, tag)[0][0] > 0


@contextmanager
def holding_commits(pg_database: str, pg_schema: str, spark) -> Iterator[CommitHold]:
    """Holds the Iceberg commits of this schema's attempts (but those let through) until release()."""
    name, key = unique("hold"), random.randrange(1 << 40)
    spark.sql("SHOW NAMESPACES IN lake").collect()  # the JDBC catalog creates iceberg_tables on first use
    prefix = f"rsf:{schema_tag(pg_schema)}:"
    sql(pg_database, f"CREATE TABLE public.{name}_free (tag TEXT PRIMARY KEY)")
    sql(
        pg_database,
        f"""
        CREATE FUNCTION public.{name}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF left(current_setting('application_name'), {len(prefix)}) = '{prefix}'
               AND current_setting('application_name') NOT IN (SELECT tag FROM public.{name}_free) THEN
                PERFORM pg_advisory_lock({key});
                PERFORM pg_advisory_unlock({key});
            END IF;
            RETURN NULL;
        END $$""",
    )
    # "aaa_": triggers fire in name order; statement level: before the UPDATE locks the table's row.
    sql(
        pg_database,
        f"CREATE TRIGGER aaa_{name} BEFORE UPDATE ON public.iceberg_tables "
        f"FOR EACH STATEMENT EXECUTE FUNCTION public.{name}()",
    )
    holder = psycopg.connect(pg_database, autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s)", (key,))
    try:
        yield CommitHold(pg_database, name, key, holder)
    finally:
        holder.close()
        sql(pg_database, f"DROP TRIGGER IF EXISTS aaa_{name} ON public.iceberg_tables")
        sql(pg_database, f"DROP FUNCTION IF EXISTS public.{name}()")
        sql(pg_database, f"DROP TABLE IF EXISTS public.{name}_free")


def queued_rewrite(
    spark, iceberg_namespace: str, store: MaintenanceStore
) -> tuple[TableRef, list[tuple], str]:
    """(table, its rows, the id of a queued rewrite_data_files job on it)."""
    ref = make_table(spark, iceberg_namespace, files=6, rows=600)
    cache(store, ref)
    return ref, rows(spark, ref), store.submit(ref.database, ref.table, ["rewrite_data_files"])
