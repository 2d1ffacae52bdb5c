"""The hand-packed binary arrays read back by Postgres as the values they were built from."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import psycopg

from runstate.eventstore.pg_arrays import text_array, timestamptz_array


def test_text_arrays_keep_nulls_empty_strings_and_any_unicode(pg_database):
    values = ["plain", None, "", "naïve ☃ 😀", '{"json": [1, "two"]}', None]
    with psycopg.connect(pg_database) as conn:
        assert conn.execute("SELECT %s", (text_array(values),)).fetchone()[0] == values
        assert conn.execute("SELECT %s", (text_array([]),)).fetchone()[0] == []


def test_timestamptz_arrays_keep_every_microsecond_and_offset_across_the_storable_range(pg_database):
    plus_five_thirty = timezone(timedelta(hours=5, minutes=30))
    values = [
        datetime(2026, 11, 28, 6, 30, 1, 123456, tzinfo=UTC),
        datetime(2026, 11, 28, 12, 0, 1, 999999, tzinfo=plus_five_thirty),
        datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),  # before the binary format's epoch
        datetime(1, 1, 2, tzinfo=UTC),
        datetime(9999, 12, 30, tzinfo=UTC),
    ]
    with psycopg.connect(pg_database) as conn:
        assert conn.execute("SELECT %s", (timestamptz_array(values),)).fetchone()[0] == values
