"""The Postgres store's row shapes: the parameters of its batch inserts and snapshot rows, and its rows read back.

The statements themselves are named queries in sql/postgres/eventstore/, run by postgres.py.
"""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from runstate.eventstore.contract import TERMINAL_EVENT_TYPES, EventType, StoredEvent
from runstate.eventstore.pg_arrays import bytea_array, text_array, timestamptz_array
from runstate.eventstore.rows import row_to_event
from runstate.eventstore.snapshots import EncodedSnapshot
from runstate.eventstore.validation import ValidEvent

# Raised by runstate_expect_inserted (sql/postgres/eventstore/002_event_feed.sql).
KEY_TAKEN_SQLSTATE = "RSK01"
# Raised by runstate_check_append (sql/postgres/eventstore/005_one_statement_append.sql).
GUESSED_WRONG_SQLSTATE = "RSK02"


_HEX_KEY_CHARS = frozenset("0123456789abcdef")
_HEX_KEY_BYTES = 32
_TEXT_KEY_MARK = b"\xff"  # never in UTF-8


def key_bytes(key: str) -> bytes:
    """The stored form of an idempotency key (sql/postgres/eventstore/006_binary_idempotency_keys.sql): 64
    lowercase hex digits (every default key) as their 32 bytes, any other key as its UTF-8 bytes, marked
    with a trailing 0xFF when those are 32 long, so that no text key reads back as a hex one."""
    if len(key) == 2 * _HEX_KEY_BYTES and _HEX_KEY_CHARS.issuperset(key):
        return bytes.fromhex(key)
    encoded = key.encode()
    return encoded + _TEXT_KEY_MARK if len(encoded) == _HEX_KEY_BYTES else encoded


def key_text(stored: bytes) -> str:
    """The idempotency key that key_bytes stored as `stored`."""
    if len(stored) == _HEX_KEY_BYTES:
        return stored.hex()
    if stored.endswith(_TEXT_KEY_MARK):
        stored = stored[:-1]
    return bytes(stored).decode()


# The decoder's C scanner, called on a JSON text that starts at its first character (as Postgres prints
# jsonb): json.loads without its wrappers (bytes' encoding detection, the whitespace checks).
_scan_json = json.scanner.make_scanner(json.JSONDecoder())


def json_value(text: str) -> Any:
    """The value of a JSON text that Postgres printed (no leading whitespace), exactly as json.loads reads it."""
    return _scan_json(text, 0)[0]


def stored_event(row: Sequence[Any]) -> StoredEvent:
    """A StoredEvent from a row of the event columns as reads.sql and feed.sql select them. The reads ask
    for rows in binary: a timestamp in 8 bytes, not 29, and a hex key in 32, not 66. The event id and the
    JSON columns come as text, decoded here: psycopg would build a UUID object to print again, and decode
    jsonb through json.loads on bytes: a feed page of 1,000 events decoded about 1.7 times slower so."""
    return row_to_event(row, decode_json=json_value, decode_key=key_text)


# The event arrays of every batch insert (append.sql, archive.sql): parameter name -> ValidEvent field.
# Every column but emitted_at and the key goes as text[] (the statements cast the UUIDs and JSON on the
# server).
_TEXT_ARRAYS = {
    "event_id": "event_id",
    "step_id": "step_id",
    "engine_attempt_id": "engine_attempt_id",
    "logical_attempt_id": "logical_attempt_id",
    "plan_version": "plan_version",
    "event_type": "event_type",
    "data": "data_json",
    "caused_by": "caused_by_signal_id",
    "parent": "parent_event_id",
    "adapter_version": "adapter_version",
    "ref": "engine_run_ref_json",
}


def _event_arrays(events: Sequence[ValidEvent]) -> dict[str, bytes | None]:
    """One binary array per column; an all-NULL column as a NULL array, which the statements' unnest pads."""
    if not events:
        return dict.fromkeys([*_TEXT_ARRAYS, "key", "emitted_at"])
    columns = dict(zip(ValidEvent._fields, zip(*events)))
    arrays = {param: _column(columns[field]) for param, field in _TEXT_ARRAYS.items()}
    keys = bytea_array([key_bytes(key) for key in columns["idempotency_key"]])
    return {**arrays, "key": keys, "emitted_at": timestamptz_array(columns["emitted_at"])}


def _column(values: tuple[Any, ...]) -> bytes | None:
    return None if values.count(None) == len(values) else text_array(values)


def _stream_params(events: Sequence[ValidEvent]) -> dict[str, Any]:
    """What the batch sets on the run's stream row."""
    return {
        "first_event_at": events[0].emitted_at,
        "started_at": _first(events, frozenset({EventType.RUN_STARTED})),
        "completed_at": _first(events, TERMINAL_EVENT_TYPES),
    }


def append_events_params(run_id: str, new: Sequence[ValidEvent], sent_ahead: int = 0) -> dict[str, Any]:
    """The parameters of append.sql's append_events: the batch's `new` events but the first `sent_ahead`,
    which head_params sent before them."""
    return {
        "run_id": run_id,
        "added": len(new),
        "offset": sent_ahead,
        **_event_arrays(new[sent_ahead:]),
        **_stream_params(new),
    }


def head_params(run_id: str, head: Sequence[ValidEvent]) -> dict[str, Any]:
    """The parameters of append.sql's insert_head."""
    return {"run_id": run_id, **_event_arrays(head)}


def snapshot_row_params(kind: str, encoded: EncodedSnapshot, reason: str) -> dict[str, Any]:
    """The snapshot row's parameters in snapshots.sql's write_snapshot."""
    return {
        "kind": kind,
        "encoding": encoded.encoding,
        "payload": encoded.payload,
        "checksum": encoded.checksum,
        "raw": encoded.raw_bytes,
        "stored": encoded.stored_bytes,
        "reason": reason,
    }


def batch_params(run_id: str, new: Sequence[tuple[int, ValidEvent]], last_seq: int) -> dict[str, Any]:
    """The parameters of append.sql's insert_new and archive.sql's insert_imported."""
    events = [e for _, e in new]
    return {
        "run_id": run_id,
        "seq": [s for s, _ in new],
        "last_seq": last_seq,
        "new": len(events),
        **_event_arrays(events),
        **_stream_params(events),
    }


def _first(events: Iterable[ValidEvent], types: frozenset[str]) -> datetime | None:
    for event in events:
        if event.event_type in types:
            return event.emitted_at
    return None


def restored_params(run_id: str, events: Sequence[StoredEvent]) -> dict[str, Any]:
    """The parameters of archive.sql's restore_from_lake: stored events, every column as it was."""

    def text(values: Iterable[str | None]) -> bytes | None:
        return _column(tuple(values))

    def as_json(value: Any) -> str | None:
        return None if value is None else json.dumps(value)

    return {
        "run_id": run_id,
        "seq": [e.run_seq for e in events],
        "event_id": text(e.event_id for e in events),
        "step_id": text(e.step_id for e in events),
        "engine_attempt_id": text(e.engine_attempt_id for e in events),
        "logical_attempt_id": text(e.logical_attempt_id for e in events),
        "plan_version": text(e.plan_version for e in events),
        "event_type": text(e.event_type for e in events),
        "data": text(as_json(e.data) for e in events),
        "key": bytea_array([key_bytes(e.idempotency_key) for e in events]),
        "caused_by": text(e.caused_by_signal_id for e in events),
        "parent": text(e.parent_event_id for e in events),
        "emitted_at": timestamptz_array([e.emitted_at for e in events]),
        "persisted_at": timestamptz_array([e.persisted_at for e in events]),
        "adapter_version": text(e.adapter_version for e in events),
        "ref": text(as_json(e.engine_run_ref) for e in events),
        "position": [e.position for e in events],
    }
