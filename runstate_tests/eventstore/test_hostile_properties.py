"""Property tests (Hypothesis): generated hostile input thrown at `runstate events append` and at
the NewEvent/validation API. Every input either succeeds and reads back identically, or gets one
line of error with nothing written."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runstate.cli import main
from runstate.config import settings as runstate_settings
from runstate.eventstore import InvalidEvent, NewEvent, PostgresEventStore

PROPERTY = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
_counter = itertools.count()

hostile_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40) | st.sampled_from(
    ["\x1b[31m", "a\nb", "\x00", "\ud800", "\\u0000", "\u202e", " ", "-x", "é" * 300]
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | hostile_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(hostile_text, children, max_size=4),
    max_leaves=20,
)
offsets = st.integers(min_value=-24 * 60 + 1, max_value=24 * 60 - 1).map(
    lambda m: timezone(timedelta(minutes=m))
)
aware_times = st.datetimes(timezones=offsets | st.just(UTC)) | st.datetimes(
    timezones=st.just(timezone(timedelta(seconds=30)))
)


def normal(value: Any) -> Any:
    """JSON equality by value: JSONB keeps numbers as decimals (1e16 may come back as an int)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return Decimal(repr(value)).normalize()
    if isinstance(value, list):
        return [normal(v) for v in value]
    return {k: normal(v) for k, v in value.items()}


def row_count(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(f'SELECT count(*) FROM "{schema}".run_events').fetchone()[0]


@pytest.fixture
def pg(pg_database: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch):
    for key, value in {
        "RUNSTATE_PG_URL": pg_database,
        "RUNSTATE_SCHEMA": pg_schema,
        "RUNSTATE_EVENTSTORE": "postgres",
    }.items():
        monkeypatch.setenv(key, value)
    runstate_settings.cache_clear()
    with PostgresEventStore(pg_database, schema=pg_schema) as store:
        store.ensure_schema()
        yield store, pg_database, pg_schema
    runstate_settings.cache_clear()


@PROPERTY
@given(
    run_id=hostile_text,
    event_type=hostile_text,
    data=json_values.map(lambda v: json.dumps(v, ensure_ascii=False))
    | hostile_text
    | st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
    emitted_at=aware_times.map(datetime.isoformat) | hostile_text,
)
def test_cli_append_either_reads_back_or_fails_in_one_line(pg, run_id, event_type, data, emitted_at):
    store, dsn, schema = pg
    run_id = f"p{next(_counter)}-{run_id}"
    before = row_count(dsn, schema)

    result = CliRunner().invoke(
        main,
        [
            "events",
            "append",
            f"--run-id={run_id}",
            f"--type={event_type}",
            f"--data={data}",
            f"--emitted-at={emitted_at}",
        ],
    )

    if result.exit_code == 0:
        (stored,) = store.fetch(run_id)
        assert (stored.event_type, normal(stored.data)) == (event_type, normal(json.loads(data)))
        assert stored.emitted_at == datetime.fromisoformat(emitted_at)
    else:
        lines = result.output.strip().splitlines()
        assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), result.output
        assert "\x1b" not in result.output and "Traceback" not in result.output
        assert row_count(dsn, schema) == before


@PROPERTY
@given(
    run_id=hostile_text,
    event_type=hostile_text,
    step_id=st.none() | hostile_text,
    data=json_values,
    emitted_at=aware_times,
)
def test_api_append_either_reads_back_or_raises_invalid_event(
    pg, run_id, event_type, step_id, data, emitted_at
):
    store, dsn, schema = pg
    run_id = f"a{next(_counter)}-{run_id}"
    before = row_count(dsn, schema)

    try:
        store.append(NewEvent(run_id, event_type, emitted_at, data=data, step_id=step_id))
    except InvalidEvent as exc:
        assert "\n" not in str(exc) and "\x1b" not in str(exc)
        assert row_count(dsn, schema) == before
        return
    (stored,) = store.fetch(run_id)
    assert (stored.event_type, stored.step_id, normal(stored.data)) == (event_type, step_id, normal(data))
    assert stored.emitted_at == emitted_at
