"""SnowflakeDatastore on fakesnow's server: pooled sessions in the schema, transactions, bounded size."""

from __future__ import annotations

import pytest

from runstate.datastore import SnowflakeDatastore


@pytest.fixture
def store(snowflake_schema):
    import snowflake.connector

    kwargs, schema = snowflake_schema
    with snowflake.connector.connect(**kwargs) as conn:
        conn.cursor().execute(f"CREATE SCHEMA {schema}")
        conn.cursor().execute(f"CREATE TABLE {schema}.ITEMS (ID INT)")
    datastore = SnowflakeDatastore(kwargs, schema=schema, pool_size=2)
    yield datastore
    datastore.close()


def test_a_pooled_connection_is_in_the_schema_and_reused(store, snowflake_schema):
    with store.connection() as first:
        schema = first.cursor().execute("SELECT CURRENT_SCHEMA()").fetchone()[0]
    with store.connection() as second:
        pass

    assert schema == snowflake_schema[1]
    assert second is first


def test_a_transaction_commits_or_rolls_back(store):
    with pytest.raises(RuntimeError), store.transaction() as cur:
        cur.execute("INSERT INTO ITEMS VALUES (1)")
        raise RuntimeError("abandon")
    with store.transaction() as cur:
        cur.execute("INSERT INTO ITEMS VALUES (2)")

    with store.cursor() as cur:
        assert cur.execute("SELECT ID FROM ITEMS").fetchall() == [(2,)]


def test_a_missing_schema_fails_the_checkout_and_leaves_nothing_pooled(snowflake_schema):
    from snowflake.connector import errors

    kwargs, _ = snowflake_schema
    store = SnowflakeDatastore(kwargs, schema="NO_SUCH_SCHEMA", pool_size=1)

    with pytest.raises(errors.ProgrammingError), store.connection():
        pass
    with pytest.raises(errors.ProgrammingError), store.connection():  # the slot was given back
        pass


def test_exactly_one_of_kwargs_or_factory_is_required():
    with pytest.raises(ValueError, match="exactly one"):
        SnowflakeDatastore()
