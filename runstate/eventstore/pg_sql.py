"""The Postgres store's row shapes: the parameters of its batch inserts, and the stream row.

The statements themselves are named queries in sql/postgres/eventstore/ (append.sql, archive.sql).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from runstate.eventstore.contract import TERMINAL_EVENT_TYPES, EventType
from runstate.eventstore.validation import ValidEvent

# Raised by runstate_expect_inserted (sql/postgres/eventstore/002_event_feed.sql).
KEY_TAKEN_SQLSTATE = "RSK01"
# Raised by runstate_check_append (sql/postgres/eventstore/005_one_statement_append.sql).
GUESSED_WRONG_SQLSTATE = "RSK02"


def one_statement_params(run_id: str, new: Sequence[ValidEvent]) -> dict[str, Any]:
    """The event columns of append.sql's append_one_statement (an all-NULL column as a NULL array)."""
    return {
        "run_id": run_id,
        "added": len(new),
        "event_id": [e.event_id for e in new],
        "step_id": _column([e.step_id for e in new]),
        "engine_attempt_id": _column([e.engine_attempt_id for e in new]),
        "logical_attempt_id": _column([e.logical_attempt_id for e in new]),
        "plan_version": _column([e.plan_version for e in new]),
        "event_type": [e.event_type for e in new],
        "data": _column([e.data_json for e in new]),
        "key": [e.idempotency_key for e in new],
        "caused_by": _column([e.caused_by_signal_id for e in new]),
        "parent": _column([e.parent_event_id for e in new]),
        "emitted_at": [e.emitted_at for e in new],
        "adapter_version": _column([e.adapter_version for e in new]),
        "ref": _column([e.engine_run_ref_json for e in new]),
        "first_event_at": new[0].emitted_at,
        "started_at": _first(new, frozenset({EventType.RUN_STARTED})),
        "completed_at": _first(new, TERMINAL_EVENT_TYPES),
    }


def _column(values: list[Any]) -> list[Any] | None:
    return None if values.count(None) == len(values) else values


@dataclass(frozen=True)
class Stream:
    last_seq: int
    event_count: int
    archived: bool


def batch_params(run_id: str, new: Sequence[tuple[int, ValidEvent]], last_seq: int) -> dict[str, Any]:
    """The parameters of append.sql's insert_new and archive.sql's insert_imported."""
    events = [e for _, e in new]
    return {
        "run_id": run_id,
        "seq": [s for s, _ in new],
        "event_id": [e.event_id for e in events],
        "step_id": [e.step_id for e in events],
        "engine_attempt_id": [e.engine_attempt_id for e in events],
        "logical_attempt_id": [e.logical_attempt_id for e in events],
        "plan_version": [e.plan_version for e in events],
        "event_type": [e.event_type for e in events],
        "data": [e.data_json for e in events],
        "key": [e.idempotency_key for e in events],
        "caused_by": [e.caused_by_signal_id for e in events],
        "parent": [e.parent_event_id for e in events],
        "emitted_at": [e.emitted_at for e in events],
        "adapter_version": [e.adapter_version for e in events],
        "ref": [e.engine_run_ref_json for e in events],
        "last_seq": last_seq,
        "new": len(events),
        "first_event_at": events[0].emitted_at,
        "started_at": _first(events, frozenset({EventType.RUN_STARTED})),
        "completed_at": _first(events, TERMINAL_EVENT_TYPES),
    }


def _first(events: Iterable[ValidEvent], types: frozenset[str]) -> datetime | None:
    for event in events:
        if event.event_type in types:
            return event.emitted_at
    return None
