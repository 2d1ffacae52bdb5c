"""The tests' migrated databases (runstate_tests/support/databases.py): copies of a template migrated once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import psycopg

from runstate import migrations
from runstate.datastore.postgres import PostgresDatastore
from runstate_tests.support.databases import (
    ADMIN_URL,
    MIGRATED_SCHEMA,
    create_migrated_database,
    drop_database,
    migrated_template,
    unique,
)


def test_a_migrated_database_holds_every_shipped_migration_and_nothing_is_left_to_apply(migrated_database):
    datastore = PostgresDatastore(migrated_database, schema=MIGRATED_SCHEMA)
    try:
        for domain in migrations.domains("postgres"):
            migrations.require_current(datastore, domain)
            assert migrations.upgrade(datastore, domain) == [], domain
    finally:
        datastore.close()
    with psycopg.connect(migrated_database) as conn:
        [partitioned] = conn.execute(
            "SELECT count(*) FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s",
            (MIGRATED_SCHEMA,),
        ).fetchone()
    assert partitioned == 0  # as a store of the default partitions=0 leaves it


def test_the_template_takes_no_connection_so_copies_made_at_once_all_succeed():
    template = migrated_template()
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        row = admin.execute(
            "SELECT datistemplate, datallowconn FROM pg_database WHERE datname = %s", (template,)
        ).fetchone()
    assert row == (True, False)

    names = [unique("rs_copy") for _ in range(4)]
    try:
        with ThreadPoolExecutor(4) as pool:
            urls = list(pool.map(create_migrated_database, names))
        for url in urls:
            with psycopg.connect(url) as conn:
                assert conn.execute("SELECT to_regclass(%s)", (f"{MIGRATED_SCHEMA}.run_events",)).fetchone()[
                    0
                ]
    finally:
        for name in names:
            drop_database(name)
