"""What the `runstate events` verbs share: opening the configured store without Dagster, reading
events from options and JSONL, and printing them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

EVENT_FIELDS = (
    "event_type",
    "step_id",
    "data",
    "emitted_at",
    "logical_attempt_id",
    "engine_attempt_id",
    "plan_version",
    "idempotency_key",
    "event_id",
    "caused_by_signal_id",
    "parent_event_id",
    "adapter_version",
    "engine_run_ref",
)
# Each run's events in a file are one batch, appended in one transaction: all of them, or none. The
# whole file is in memory while that happens, about 3 KB an event at the peak (300,000 events took
# 777 MB), so a file holds at most this many; a larger one is refused before anything is written.
MAX_FILE_EVENTS = 100_000


@contextmanager
def open_store(backend: str | None = None) -> Iterator[Any]:
    """The configured store (RUNSTATE_EVENTSTORE, or `backend`), closed afterwards.

    The schema is checked, never migrated: concurrent commands must not race for the migration lock,
    and a schema behind this runstate is one `Error:` line saying to run `runstate db upgrade`."""
    from runstate import wiring
    from runstate.config import settings
    from runstate.eventstore import EventStoreError
    from runstate.eventstore.config import EventStoreConfig

    try:
        config = EventStoreConfig.from_settings(settings())
    except ValueError as exc:  # a bad setting is the user's input too: one line, not a traceback
        raise EventStoreError(str(exc)) from None
    backend = backend or config.backend
    try:
        store = wiring.event_store(config, backend)
    except ValueError as exc:  # a bad schema name in the settings, say
        raise EventStoreError(f"event store settings: {exc}") from None
    try:
        wiring.require_schema("eventstore", backend, config)
        yield store
    finally:
        store.close()


def parse_time(value: str | None, run_id: str, index: int | None = None) -> datetime:
    from runstate.eventstore import InvalidEvent

    if value is None:
        return datetime.now(UTC)
    try:
        return datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise InvalidEvent(
            "emitted_at", f"{value!r} is not an ISO 8601 timestamp", run_id=run_id, index=index
        ) from None


def event_from_mapping(doc: Any, default_run_id: str | None, where: str) -> Any:
    """A NewEvent from one JSON object (a JSONL line); unknown keys are an error, not silently dropped."""
    from runstate.eventstore import NewEvent

    if not isinstance(doc, dict):
        raise click.ClickException(f"{where}: expected a JSON object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - set(EVENT_FIELDS) - {"run_id"})
    if unknown:
        raise click.ClickException(f"{where}: unknown field(s) {ascii(', '.join(unknown))[1:-1]}")
    run_id = doc.get("run_id", default_run_id)
    if not run_id:
        raise click.ClickException(f"{where}: no run_id (give --run-id or a run_id field)")
    if "event_type" not in doc:
        raise click.ClickException(f"{where}: missing field 'event_type'")
    fields = {key: doc[key] for key in EVENT_FIELDS if key in doc}
    fields["emitted_at"] = parse_time(doc.get("emitted_at"), run_id)
    return NewEvent(run_id=run_id, **fields)


def read_jsonl(path: Path, default_run_id: str | None, room: int = MAX_FILE_EVENTS) -> list[Any]:
    """The file's events, read a line at a time; at most `room` of them, or an error before the rest is read."""
    events = []
    with path.open() as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            if len(events) == room:
                raise click.ClickException(
                    f"{path}: a file holds at most {MAX_FILE_EVENTS:,} events (each run's are appended in "
                    "one transaction, from memory): split it; nothing written"
                )
            where = f"{path}:{number}"
            events.append(event_from_mapping(load_json(line, where), default_run_id, where))
    return events


def load_json(text: str | None, where: str) -> Any:
    """JSON text to a value; malformed or absurdly nested JSON is one line of error."""
    from runstate.eventstore import MAX_JSON_DEPTH

    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.ClickException(f"{where} is not JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise click.ClickException(f"{where} is nested more than {MAX_JSON_DEPTH} levels deep") from None


def validate_all(by_run: dict[str, list[Any]]) -> None:
    """Every run's batch, before anything is written (a store validates only its own batch)."""
    from runstate.eventstore import InvalidEvent, validate_batch

    for rid, run_events in by_run.items():
        try:
            validate_batch(rid, run_events)
        except InvalidEvent as exc:
            raise InvalidEvent(
                exc.field, f"{str(exc).split(': ', 1)[-1]}; nothing written", run_id=rid, index=exc.index
            ) from None


def event_to_json(event: Any) -> dict[str, Any]:
    doc = {name: getattr(event, name) for name in event.__dataclass_fields__}
    return {key: value.isoformat() if isinstance(value, datetime) else value for key, value in doc.items()}


def short_json(value: Any, width: int = 60) -> str:
    if value is None:
        return ""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 3] + "..."


def format_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
        for row in (header, *rows)
    ]
    return "\n".join(lines)
