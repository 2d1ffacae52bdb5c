"""Hostile input at the validation edge (issue 15): each case is refused with one clear line, or
accepted and read back identically; refused input writes nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from runstate.eventstore import (
    MAX_JSON_DEPTH,
    EventStoreError,
    InvalidEvent,
    NewEvent,
    validate_event,
)
from runstate_tests.eventstore.conftest import ev


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def test_invalid_event_is_an_event_store_error_and_a_value_error():
    assert issubclass(InvalidEvent, EventStoreError) and issubclass(InvalidEvent, ValueError)


@pytest.mark.parametrize(
    "emitted_at",
    [
        datetime(1, 1, 1, 0, 0, tzinfo=timezone(timedelta(hours=1))),
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-1))),
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, tzinfo=UTC),
        datetime(2026, 1, 1, tzinfo=timezone(timedelta(seconds=30))),
    ],
)
def test_timestamps_the_stores_cannot_round_trip_are_refused(store, emitted_at):
    with pytest.raises(InvalidEvent, match="emitted_at"):
        store.append(NewEvent("edge", "RunStarted", emitted_at))

    assert store.fetch("edge") == []


@pytest.mark.parametrize(
    "emitted_at",
    [datetime(1, 1, 2, 12, tzinfo=timezone(timedelta(hours=1))), datetime(9999, 12, 29, tzinfo=UTC)],
)
def test_timestamps_near_the_edges_round_trip(store, emitted_at):
    store.append(NewEvent("edge", "RunStarted", emitted_at))

    (got,) = store.fetch("edge")
    assert got.emitted_at == emitted_at
    assert store.project("edge").status == "RUNNING"


def test_deeply_nested_data_gets_one_line_not_a_recursion_error():
    with pytest.raises(InvalidEvent, match=f"nested more than {MAX_JSON_DEPTH} levels") as caught:
        validate_event(ev("r1", "X", data=nested(5000)))

    assert "\n" not in str(caught.value)
    validate_event(ev("r1", "X", data=nested(MAX_JSON_DEPTH - 1)))


def test_nesting_just_over_the_limit_is_refused_by_the_store(store):
    with pytest.raises(InvalidEvent, match="nested"):
        store.append(ev("r1", "X", data=nested(MAX_JSON_DEPTH + 1)))

    assert store.fetch("r1") == []


@pytest.mark.parametrize("run_id", ["run\x1b[31mred", "run\nid", "run\x00id", "tab\there", "bidi\u202e"])
def test_run_ids_with_control_characters_or_escapes_are_refused(store, run_id):
    with pytest.raises(InvalidEvent, match="run_id") as caught:
        store.append(ev(run_id, "RunStarted"))

    assert "\x1b" not in str(caught.value) and "\n" not in str(caught.value)


def test_literal_backslash_u0000_text_is_data_but_a_real_nul_is_not(store):
    literal = {"note": "\\u0000 is how JSON escapes NUL", "k\\u0000": "\\\\u0000"}
    store.append(ev("r1", "X", data=literal))

    with pytest.raises(InvalidEvent, match="NUL"):
        store.append(ev("r1", "Y", data={"note": "a real \x00 NUL"}))

    (got,) = store.fetch("r1")
    assert got.data == literal


def test_refused_encodings_are_named(store):
    with pytest.raises(InvalidEvent, match="not valid UTF-8"):
        store.append(ev("r1", "X", data={"s": "\ud800"}))
    with pytest.raises(InvalidEvent, match="not JSON-serialisable"):
        store.append(ev("r1", "X", data={"n": float("nan")}))

    assert store.fetch("r1") == []


def test_projection_backfill_reports_an_unreadable_run_and_carries_on(backend):
    """A run stored before validation refused year-0 timestamps (written here by raw SQL)."""
    store = backend.make()
    store.append(ev("good", "RunStarted"))
    store.append(ev("poisoned", "RunStarted"))
    table = "run_events" if backend.name == "postgres" else "RUN_EVENTS"
    stamp = "0001-01-01 00:00:00+01:00"
    cast = "::timestamptz" if backend.name == "postgres" else "::TIMESTAMP_TZ"
    backend.sql(f"UPDATE {table} SET emitted_at = %s{cast} WHERE run_id = %s", (stamp, "poisoned"))

    report = store.project_runs(["poisoned", "good"])

    assert report.runs_projected == 1 and [run_id for run_id, _ in report.failed] == ["poisoned"]
    assert store.project("good").status == "RUNNING"
    with pytest.raises(EventStoreError):
        store.fetch("poisoned")


def test_json_numbers_read_back_by_value(store):
    data = {"i": 10**30, "f": 0.1, "neg": -2.5e-7, "list": [1, 2.0, None, True, "é"]}
    store.append(ev("r1", "X", data=data))

    (got,) = store.fetch("r1")
    assert json.dumps(got.data, sort_keys=True) == json.dumps(data, sort_keys=True)
