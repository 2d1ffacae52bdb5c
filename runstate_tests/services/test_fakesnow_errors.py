"""fakesnow answers a failed statement as Snowflake does: a statement error, at once and once."""

from __future__ import annotations

import contextlib

import pytest


@pytest.fixture
def cursor(snowflake_schema):
    import snowflake.connector

    kwargs, schema = snowflake_schema
    with contextlib.closing(snowflake.connector.connect(**kwargs)) as conn:
        cur = conn.cursor()
        cur.execute(f"CREATE SCHEMA {schema}")
        cur.execute(f"USE SCHEMA {schema}")
        cur.execute("CREATE TABLE items (id INT PRIMARY KEY, n INT)")
        yield cur


def test_a_duplicate_key_is_a_statement_error_not_a_server_fault(cursor):
    from snowflake.connector import errors

    cursor.execute("INSERT INTO items VALUES (1, 1)")
    # SQLSTATE class 23: the connector raises IntegrityError, never InternalServerError after a retry.
    with pytest.raises(errors.IntegrityError) as raised:
        cursor.execute("INSERT INTO items VALUES (1, 2)")

    assert raised.value.errno == 100072 and "Duplicate key" in raised.value.msg
    assert cursor.execute("SELECT id, n FROM items").fetchall() == [(1, 1)]


def test_a_statement_in_an_aborted_transaction_is_a_statement_error(cursor):
    from snowflake.connector import errors

    cursor.execute("BEGIN")
    with pytest.raises(errors.IntegrityError):
        cursor.execute("INSERT INTO items VALUES (NULL, 1)")  # NOT NULL key: the transaction aborts
    with pytest.raises(errors.ProgrammingError) as raised:
        cursor.execute("INSERT INTO items VALUES (2, 2)")
    cursor.execute("ROLLBACK")

    assert raised.value.errno == 625 and "aborted" in raised.value.msg
    assert cursor.execute("SELECT count(*) FROM items").fetchall() == [(0,)]
