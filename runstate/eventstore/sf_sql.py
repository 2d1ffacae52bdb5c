"""The Snowflake store's row shapes and driver helpers: columns, the VALUES source, retries, rows."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, TypeVar

from runstate.eventstore import rows
from runstate.eventstore.contract import StoredEvent

T = TypeVar("T")

COLUMNS = (
    "RUN_ID, RUN_SEQ, EVENT_ID, STEP_ID, ENGINE_ATTEMPT_ID, LOGICAL_ATTEMPT_ID, PLAN_VERSION, EVENT_TYPE,"
    " EVENT_DATA, IDEMPOTENCY_KEY, CAUSED_BY_SIGNAL_ID, PARENT_EVENT_ID, EMITTED_AT, PERSISTED_AT,"
    " ADAPTER_VERSION, ENGINE_RUN_REF, POSITION"
)
S_COLUMNS = ", ".join(f"s.{c.strip()}" for c in COLUMNS.split(","))
VALUES_ROW = "(" + ", ".join(["%s"] * 17) + ")"
# column1..column17 of the VALUES source, typed; PARSE_JSON in a SELECT, never inside VALUES.
SOURCE_SELECT = (
    "SELECT column1 AS RUN_ID, column2 AS RUN_SEQ, column3 AS EVENT_ID, column4 AS STEP_ID,"
    " column5 AS ENGINE_ATTEMPT_ID, column6 AS LOGICAL_ATTEMPT_ID, column7 AS PLAN_VERSION,"
    " column8 AS EVENT_TYPE, PARSE_JSON(column9) AS EVENT_DATA, column10 AS IDEMPOTENCY_KEY,"
    " column11 AS CAUSED_BY_SIGNAL_ID, column12 AS PARENT_EVENT_ID, column13::TIMESTAMP_TZ AS EMITTED_AT,"
    " COALESCE(column14::TIMESTAMP_TZ, CURRENT_TIMESTAMP()) AS PERSISTED_AT, column15 AS ADAPTER_VERSION,"
    " PARSE_JSON(column16) AS ENGINE_RUN_REF, column17 AS POSITION FROM VALUES "
)


class Retry(Exception):
    """Internal: the transaction saw a race and must be retried from the start."""


_RETRY_WORDS = ("conflict", "lock", "aborted", "deadlock", "duplicate key", "timeout", "timed out")


def retryable(exc: BaseException) -> bool:
    """Races and transient failures: ours (Retry), Snowflake lock/abort errors, and fakesnow's
    HTTP 500 (how its server reports a DuckDB write-write conflict)."""
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
