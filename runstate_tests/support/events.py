"""Events for the event store's tests: NewEvents at a fixed time, and raw SQL access through a backend."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from runstate.eventstore import NewEvent

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def ev(run_id: str, event_type: str, n: int = 0, **kw: Any) -> NewEvent:
    """A NewEvent at T0 + n seconds; `key` kw sets an explicit idempotency key."""
    if "key" in kw:
        kw["idempotency_key"] = kw.pop("key")
    return NewEvent(run_id=run_id, event_type=event_type, emitted_at=T0 + timedelta(seconds=n), **kw)


def events_table(backend: Backend) -> str:
    return "run_events" if backend.name == "postgres" else "RUN_EVENTS"


def count_rows(backend: Backend, table: str, run_id: str) -> int:
    return backend.sql(f"SELECT COUNT(*) FROM {table} WHERE run_id = %s", (run_id,))[0][0]


@dataclass
class Backend:
    name: str
    make: Callable[..., Any]
    sql: Callable[[str, tuple], list[tuple]]
    # Divides the thread tests' work: fakesnow is one DuckDB behind HTTP, orders of magnitude slower.
    # Snowflake's 100 leaves 5 appends a thread, the fewest that still re-send an earlier key.
    scale: int
