"""Translate a Dagster run's event log into canonical run-state events.

Idempotency keys come from the Dagster run id, the step key and the step attempt, so reading the same
event log twice (a re-delivered sensor tick, a cursor reset) appends nothing new.

A run ends once: its record stops at its first terminal event (RunCompleted, RunFailed or RunCancelled),
and every terminal event of a run shares one idempotency key, so the first one stored wins. A run that
was declared dead and failed, and whose paused process then wrote on, is recorded as failed only (its
process stops at its next check, `runstate.defs.runs.heartbeat`, but the record must not depend on it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from dagster import DagsterEventType, DagsterInstance
from dagster._core.events.log import EventLogEntry

from runstate.eventstore import EventType, NewEvent, idempotency_key

ADAPTER_VERSION = "runstate-dagster/1"

RUN_EVENT_TYPES = {
    DagsterEventType.RUN_START: EventType.RUN_STARTED,
    DagsterEventType.RUN_SUCCESS: EventType.RUN_COMPLETED,
    DagsterEventType.RUN_FAILURE: EventType.RUN_FAILED,
    DagsterEventType.RUN_CANCELED: EventType.RUN_CANCELLED,
}
STEP_EVENT_TYPES = {
    DagsterEventType.STEP_START: EventType.STEP_STARTED,
    DagsterEventType.STEP_RESTARTED: EventType.STEP_STARTED,
    DagsterEventType.STEP_SUCCESS: EventType.STEP_COMPLETED,
    DagsterEventType.STEP_FAILURE: EventType.STEP_FAILED,
    DagsterEventType.STEP_UP_FOR_RETRY: EventType.STEP_RETRYING,
}
RECORDED_TYPES = set(RUN_EVENT_TYPES) | set(STEP_EVENT_TYPES)
RUN_STATUS_TYPES = set(RUN_EVENT_TYPES)
TERMINAL_TYPES = {DagsterEventType.RUN_SUCCESS, DagsterEventType.RUN_FAILURE, DagsterEventType.RUN_CANCELED}
RUN_ENDED = "RunEnded"  # the event type part of the one idempotency key of a run's terminal event


def _error_text(entry: EventLogEntry) -> str | None:
    data = entry.dagster_event.event_specific_data if entry.dagster_event else None
    error = getattr(data, "error", None)
    if error is None:
        return None
    while error.cause is not None:  # Dagster wraps the op's exception; the user wants the root cause
        error = error.cause
    return error.message.strip()[:2000]


def canonical_events(run_id: str, job_name: str, entries: Sequence[EventLogEntry]) -> list[NewEvent]:
    """The canonical events of one run, in event-log order, with 1-based step attempt numbers, up to and
    including its first terminal event."""
    attempts: dict[str, int] = defaultdict(int)
    events: list[NewEvent] = []
    for entry in entries:
        event_type = entry.dagster_event_type
        emitted_at = datetime.fromtimestamp(entry.timestamp, tz=UTC)
        ref = {"dagster_run_id": run_id, "job_name": job_name}
        if event_type in RUN_EVENT_TYPES:
            data = {"job_name": job_name}
            if event_type == DagsterEventType.RUN_FAILURE:
                data["error"] = (entry.message or "")[:2000]
            terminal = event_type in TERMINAL_TYPES
            events.append(
                NewEvent(
                    run_id,
                    RUN_EVENT_TYPES[event_type],
                    emitted_at,
                    data=data,
                    adapter_version=ADAPTER_VERSION,
                    engine_run_ref=ref,
                    idempotency_key=idempotency_key(run_id, None, None, RUN_ENDED, None)
                    if terminal
                    else None,
                )
            )
            if terminal:
                break
        elif event_type in STEP_EVENT_TYPES and entry.step_key:
            if STEP_EVENT_TYPES[event_type] == EventType.STEP_STARTED:
                attempts[entry.step_key] += 1
            attempt = max(attempts[entry.step_key], 1)
            data = {"attempt": attempt}
            error = _error_text(entry)
            if error:
                data["error"] = error
            events.append(
                NewEvent(
                    run_id,
                    STEP_EVENT_TYPES[event_type],
                    emitted_at,
                    data=data,
                    step_id=entry.step_key,
                    logical_attempt_id=str(attempt),
                    engine_attempt_id=str(attempt),
                    adapter_version=ADAPTER_VERSION,
                    engine_run_ref=ref,
                )
            )
    return events


def run_ids_with_status_changes(
    instance: DagsterInstance, cursors: dict[str, str], limit: int
) -> tuple[list[str], dict[str, str]]:
    """Runs whose status changed after the per-status cursors, oldest first, and the new cursors."""
    changes: list[tuple[float, str]] = []
    new_cursors = dict(cursors)
    for event_type in RUN_STATUS_TYPES:
        result = instance.fetch_run_status_changes(
            event_type, limit=limit, cursor=cursors.get(event_type.value), ascending=True
        )
        changes.extend((r.event_log_entry.timestamp, r.event_log_entry.run_id) for r in result.records)
        if result.records:
            new_cursors[event_type.value] = result.cursor
    changes.sort()
    return list(dict.fromkeys(run_id for _, run_id in changes)), new_cursors


def record_runs(instance: DagsterInstance, store, run_ids: Iterable[str]) -> dict[str, int]:
    """Append each run's canonical events; returns run_id -> events newly persisted."""
    persisted: dict[str, int] = {}
    for run_id in run_ids:
        run = instance.get_run_by_id(run_id)
        if run is None:
            continue
        entries = instance.all_logs(run_id, of_type=RECORDED_TYPES)
        events = canonical_events(run_id, run.job_name, entries)
        if events:
            results = store.append_batch(run_id, events)
            persisted[run_id] = sum(1 for r in results if r.persisted)
    return persisted
