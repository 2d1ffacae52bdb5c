"""A schema made before the per-domain ledgers (one `schema_migrations` for every file) upgrades in place.

The deployment is rebuilt as the old runner left it: every file applied in version order and recorded
in `schema_migrations` with the checksum that runner computed (the SHA-256 of the file as it was on
main, pinned below). The new runner must then apply only the files added since, move each row
unchanged into its domain's ledger, and drop the old table once it is empty.
"""

from __future__ import annotations

import psycopg
import pytest

from runstate import migrations
from runstate.datastore import PostgresDatastore, SnowflakeDatastore

# sha256 of sql/<backend>/NNN_name.sql before the files moved into domain folders: what the ledgers of
# existing deployments hold. A moved file that no longer matches would refuse every upgrade.
RECORDED = {
    "postgres": {
        "001": "8b06492b3f493cde095fd93b24c22d80cf5d64edfce9f00747d138db0d82e4ce",
        "002": "8a4cae726b6b866a87b671d4d2bd764af185f47bf098d845fe33fe7f69312536",
        "003": "fb5136e7b4110c3c9fbf465f38fc8d21720161b957202dbe01f0dbe5ed2c0d67",
        "004": "0f8ef80ff20f01f82ed3f686b6218242a1ac9827e9f8211e77853aeb7d4552b0",
        "010": "3330fde86f485f1d0d121fb44a1beeff1772078305d4e113523c201d4d3c4e3f",
        "011": "3c8a7c3a1193a1416d6397585a21fc666973dcbe8fc9ab8348e0949da0525073",
        "012": "ceb00c7b584ee03b1c73644530a5f14600e858ca44c120112b5cf7db60ae6818",
        "013": "e65eb73bca7baf79a97a757464132555e52074e17a9b75ba7c21bada37832844",
    },
    "snowflake": {
        "001": "c0ed6dc9e23291da2c915256cbedc71d3348d566a1c8c76852b2a1a67a9a23ca",
        "002": "f42762b4602833a09e6a27afcb7adddc495a8b09ec1122af040fd14bacab3898",
        "003": "553e287fd779885654083843123b3834209a4dd845fb1d97af76dca5972ac54e",
    },
}


def _legacy_files(backend: str) -> list[migrations.Migration]:
    """The files the old runner knew: every domain's, in one version order."""
    files = [m for d in migrations.domains(backend) for m in migrations.discover(backend, d)]
    return sorted((m for m in files if m.version in RECORDED[backend]), key=lambda m: m.version)


@pytest.mark.parametrize("backend", ["postgres", "snowflake"])
def test_the_moved_files_keep_the_checksums_existing_ledgers_recorded(backend):
    files = _legacy_files(backend)

    assert {m.version: m.checksum for m in files} == RECORDED[backend]


def _deploy_as_before_postgres(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE SCHEMA {schema}")
        cur.execute(f"SET LOCAL search_path TO {schema}, public")
        cur.execute(
            "CREATE TABLE schema_migrations (version TEXT PRIMARY KEY, name TEXT NOT NULL,"
            " checksum TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for migration in _legacy_files("postgres"):
            cur.execute(migration.text)
            cur.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (migration.version, migration.name, RECORDED["postgres"][migration.version]),
            )
        cur.execute("INSERT INTO run_streams (run_id) VALUES ('kept')")


def _added_since(backend: str, domain: str) -> list[str]:
    """The versions of a domain's files that the old runner never knew (added after the move)."""
    return [m.version for m in migrations.discover(backend, domain) if m.version not in RECORDED[backend]]


def _ledger(dsn: str, schema: str, table: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            f"SELECT version, name, checksum, applied_at FROM {schema}.{table} ORDER BY version"
        ).fetchall()


def test_a_postgres_schema_with_the_shared_ledger_upgrades_in_place(fresh_database):
    _deploy_as_before_postgres(fresh_database, "old")
    before = _ledger(fresh_database, "old", "schema_migrations")
    store = PostgresDatastore(fresh_database, schema="old")
    domains = ("eventstore", "maintenance")
    try:
        for domain in domains:
            if not _added_since("postgres", domain):
                migrations.require_current(store, domain)  # the old ledger counts until it is moved

        applied = migrations.upgrade_all(store)
        again = migrations.upgrade_all(store)
    finally:
        store.close()

    assert {d: [m.version for m in files] for d, files in applied.items()} == {
        d: _added_since("postgres", d) for d in domains
    }
    assert again == {d: [] for d in domains}
    moved = _ledger(fresh_database, "old", "eventstore_migrations") + _ledger(
        fresh_database, "old", "maintenance_migrations"
    )
    assert sorted(row for row in moved if row[0] in RECORDED["postgres"]) == before
    with psycopg.connect(fresh_database) as conn:
        assert conn.execute("SELECT to_regclass('old.schema_migrations')").fetchone()[0] is None
        assert conn.execute("SELECT run_id FROM old.run_streams").fetchall() == [("kept",)]


def test_one_domain_upgraded_leaves_the_other_domains_rows_in_the_shared_ledger(fresh_database):
    _deploy_as_before_postgres(fresh_database, "half")
    store = PostgresDatastore(fresh_database, schema="half")
    try:
        added = [m.version for m in migrations.upgrade(store, "eventstore")]

        left = [row[0] for row in _ledger(fresh_database, "half", "schema_migrations")]
        # The maintenance domain still reads its legacy rows: only its files added since are pending.
        pending = [m.version for m in migrations.status(store, "maintenance") if not m.applied]
    finally:
        store.close()

    assert added == _added_since("postgres", "eventstore")
    assert left == ["010", "011", "012", "013"]
    assert pending == _added_since("postgres", "maintenance")


def test_a_snowflake_schema_with_the_shared_ledger_upgrades_in_place(snowflake_schema):
    import snowflake.connector

    kwargs, schema = snowflake_schema
    conn = snowflake.connector.connect(**kwargs)
    cur = conn.cursor()
    cur.execute(f"CREATE SCHEMA {schema}")
    cur.execute(f"USE SCHEMA {schema}")
    cur.execute(
        "CREATE TABLE SCHEMA_MIGRATIONS (VERSION VARCHAR PRIMARY KEY, NAME VARCHAR NOT NULL,"
        " CHECKSUM VARCHAR NOT NULL, APPLIED_AT TIMESTAMP_TZ DEFAULT CURRENT_TIMESTAMP())"
    )
    for migration in _legacy_files("snowflake"):
        for statement in migrations.split_statements(migration.text):
            cur.execute(statement)
        cur.execute(
            "INSERT INTO SCHEMA_MIGRATIONS (VERSION, NAME, CHECKSUM) VALUES (%s, %s, %s)",
            (migration.version, migration.name, RECORDED["snowflake"][migration.version]),
        )
    store = SnowflakeDatastore(kwargs, schema=schema, pool_size=1)
    try:
        migrations.require_current(store, "eventstore")

        applied = migrations.upgrade(store, "eventstore")
    finally:
        store.close()

    assert applied == []
    cur.execute(f"SELECT VERSION, CHECKSUM FROM {schema}.EVENTSTORE_MIGRATIONS ORDER BY VERSION")
    assert dict(cur.fetchall()) == RECORDED["snowflake"]
    cur.execute(
        "SELECT COUNT(*) FROM INFORMATION_SCHEMA.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 'SCHEMA_MIGRATIONS'",
        (schema,),
    )
    assert cur.fetchone()[0] == 0
    conn.close()
