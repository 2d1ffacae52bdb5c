"""The Snowflake store's driver helpers: VALUES placeholders and their values, retries, conversions, rows.

The statements themselves are named queries in sql/snowflake/eventstore/.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from runstate.eventstore import rows
from runstate.eventstore.contract import StoredEvent
from runstate.eventstore.validation import ValidEvent

T = TypeVar("T")

# The placeholders of one row of merge_events' VALUES source (sql/snowflake/eventstore/append.sql).
VALUES_ROW = "(" + ", ".join(["%s"] * 17) + ")"


def values_rows(count: int) -> str:
    """The `{rows}` of append.sql's merge_events / insert_new_events: `count` placeholder groups. The one
    piece of SQL text composed at run time (the row count varies); the values themselves are bound."""
    return ", ".join([VALUES_ROW] * count)


def values_params(
    run_id: str,
    rows: Sequence[tuple[int, ValidEvent]],
    stamps: Mapping[int, datetime] | None,
    position_base: int,
) -> list[Any]:
    """The values of those placeholder groups, row after row: each event with its seq, its persisted_at
    when `stamps` keeps one (an import), and its feed position, the next after `position_base`."""
    params: list[Any] = []
    for offset, (seq, e) in enumerate(rows, 1):
        stamp = stamps.get(seq) if stamps else None
        params += [
            run_id,
            seq,
            e.event_id,
            e.step_id,
            e.engine_attempt_id,
            e.logical_attempt_id,
            e.plan_version,
            e.event_type,
            e.data_json,
            e.idempotency_key,
            e.caused_by_signal_id,
            e.parent_event_id,
            e.emitted_at.isoformat(),
            stamp.isoformat() if stamp else None,
            e.adapter_version,
            e.engine_run_ref_json,
            position_base + offset,
        ]
    return params


class Retry(Exception):
    """Internal: the transaction saw a race and must be retried from the start."""


_RETRY_WORDS = ("conflict", "lock", "aborted", "deadlock", "duplicate key", "timeout", "timed out")


def retryable(exc: BaseException) -> bool:
    """Races and transient failures: ours (Retry), server faults (HTTP 5xx), and Snowflake's lock,
    abort and conflict errors (fakesnow's DuckDB conflicts and duplicate keys arrive worded so)."""
    from snowflake.connector import errors as sf_errors

    transient = (
        Retry,
        sf_errors.InternalServerError,
        sf_errors.OperationalError,
        sf_errors.ServiceUnavailableError,
    )
    if isinstance(exc, transient):
        return True
    return any(word in str(exc).lower() for word in _RETRY_WORDS)


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def from_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def b64(value: Any) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (ValueError, TypeError):
        return b""  # undecodable payload: the checksum check reports it as corrupt


def row_to_event(row: Sequence[Any]) -> StoredEvent:
    # The connector returns VARIANT columns as JSON text.
    return rows.row_to_event(row, decode_json=from_json)
