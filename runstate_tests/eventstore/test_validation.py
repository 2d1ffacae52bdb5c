"""Hostile input at the validation edge (issue 15): each case is refused with one clear line, or
accepted and read back identically; refused input writes nothing."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runstate.eventstore import (
    MAX_JSON_DEPTH,
    EventStoreError,
    InvalidEvent,
    NewEvent,
    validate_event,
)
from runstate.eventstore.validation import _validate_columns, _validate_events
from runstate_tests.support.events import ev


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


# -- the batch path and the event-by-event path agree ---------------------------------------------


def _mostly(valid: object, hostile: st.SearchStrategy) -> st.SearchStrategy:
    """`valid` nine times in ten: whole batches of valid events must come up too."""
    return st.integers(0, 9).flatmap(lambda n: st.just(valid) if n else hostile)


_hostile_texts = st.sampled_from(["", " ", "a" * 257, "\x1b[31m", "\ud800", "é", "x\ny"]) | st.just(7)
_hostile_data = st.sampled_from(
    [{"n": float("nan")}, "é", "\\u0000", "\x00", nested(MAX_JSON_DEPTH + 1), {"t": ["a"] * 60}, {1j: 1}]
)
_hostile_times = st.sampled_from(
    [
        datetime(2026, 1, 1, tzinfo=timezone(timedelta(0))),
        datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2))),
        datetime(2026, 1, 1),
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, tzinfo=UTC),
        "2026-01-01T00:00:00Z",
    ]
)
_hostile_uuids = st.sampled_from(["6F1C2A1E-6E4B-4D7E-9A43-0A7A1B2C3D4E", "nope", ""]) | st.uuids()
_UUID = "6f1c2a1e-6e4b-4d7e-9a43-0a7a1b2c3d4e"


@st.composite
def _events(draw: st.DrawFn) -> NewEvent:
    return NewEvent(
        run_id=draw(_mostly("r-1", st.sampled_from(["r-2", 1]))),
        event_type=draw(_mostly("StepStarted", _hostile_texts | st.just("T" * 300))),
        emitted_at=draw(_mostly(datetime(2026, 1, 1, tzinfo=UTC), _hostile_times)),
        data=draw(_mostly({"i": 1, "tags": ["a"]}, _hostile_data | st.none())),
        step_id=draw(_mostly("step-1", _hostile_texts | st.none())),
        logical_attempt_id=draw(_mostly(None, _hostile_texts | st.just("0"))),
        adapter_version=draw(_mostly(None, _hostile_texts)),
        event_id=draw(_mostly(_UUID, _hostile_uuids)),
        idempotency_key=draw(_mostly(None, _hostile_texts | st.just("k" * 513))),
        caused_by_signal_id=draw(_mostly(None, _hostile_uuids | st.just(_UUID))),
        engine_run_ref=draw(_mostly(None, _hostile_data | st.just({"ref": 1}))),
    )


def _assert_one_verdict(batch: list[NewEvent]) -> None:
    """The batch path declines (None) whatever the event-by-event path refuses, and otherwise returns
    exactly what that path returns."""
    try:
        expected = _validate_events("r-1", batch, 1024)
    except InvalidEvent:
        expected = None
    fast = _validate_columns("r-1", batch, 1024)
    assert fast is None or fast == expected


@given(st.lists(_events(), min_size=1, max_size=4))
@settings(max_examples=300, deadline=None)
def test_the_batch_path_and_the_event_by_event_path_give_one_verdict(events):
    """_validate_columns either declines (None) or returns exactly what validate_event returns for
    every event; whatever validate_event refuses, it declines."""
    _assert_one_verdict(events)


def test_the_batch_path_takes_the_common_shape():
    """The shape every writer sends (fresh UUIDs, UTC times, small ASCII payloads) takes the batch path."""
    batch = [ev("r-1", "StepStarted", step_id=f"s{i}", data={"i": i, "tags": ["a"]}) for i in range(100)]
    assert _validate_columns("r-1", batch, 1024) == _validate_events("r-1", batch, 1024)


class _EqualToAll:
    """Hostile: claims to equal anything, the batch's run id included."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


_HOSTILE = {
    "run_id": ["r-2", 1, _EqualToAll()],
    "event_type": ["", "  ", "\x1b[31m", "T" * 300, 7, None],
    "emitted_at": [
        datetime(2026, 1, 1),
        datetime(2026, 1, 1, tzinfo=timezone(timedelta(seconds=30))),
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, tzinfo=UTC),
        "2026-01-01T00:00:00Z",
    ],
    "data": [
        {"n": float("nan")},
        "\x00",
        "\ud800",
        nested(MAX_JSON_DEPTH + 1),
        "a" * 2000,
        {1j: 1},
        object(),
    ],
    "step_id": ["", "a" * 257, "\x1b", "\ud800", "x\ny", 7],
    "event_id": ["6F1C2A1E-6E4B-4D7E-9A43-0A7A1B2C3D4E", "nope", "", 7],
    "idempotency_key": ["", "k" * 513, "\x00", 7],
    "caused_by_signal_id": ["nope", 7, "6f1c2a1e-6e4b-4d7e-9a43-0a7a1b2c3d4e"],
    "engine_run_ref": [{"n": float("nan")}, "\x00", "a" * 2000],
}


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, values in _HOSTILE.items() for v in values])
def test_one_odd_field_in_a_batch_gets_the_event_by_event_verdict(field, value):
    """Each rule of the batch path, broken alone in the middle of a valid batch: the batch path declines
    whatever the event-by-event path refuses, and gives what it gives otherwise."""
    batch = [ev("r-1", "StepStarted", n, step_id="s", data={"i": n}) for n in range(3)]
    batch[1] = dataclasses.replace(batch[1], **{field: value})
    _assert_one_verdict(batch)
