"""Conversions between validated, new and stored events shared by both stores."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from runstate.eventstore.contract import InvalidEvent, NewEvent, StoredEvent
from runstate.eventstore.validation import ValidEvent, validate_batch


def as_stored(
    run_id: str, seq: int, event: ValidEvent, persisted_at: datetime, *, payloads: bool = True
) -> StoredEvent:
    """The stored form of a validated event; without `payloads`, `data` and `engine_run_ref` stay None
    (decoding them is much of the cost of a fold that never reads them)."""
    return StoredEvent(
        run_id=run_id,
        run_seq=seq,
        event_type=event.event_type,
        emitted_at=event.emitted_at,
        persisted_at=persisted_at,
        idempotency_key=event.idempotency_key,
        event_id=event.event_id,
        data=json.loads(event.data_json) if payloads and event.data_json is not None else None,
        step_id=event.step_id,
        engine_attempt_id=event.engine_attempt_id,
        logical_attempt_id=event.logical_attempt_id,
        plan_version=event.plan_version,
        caused_by_signal_id=event.caused_by_signal_id,
        parent_event_id=event.parent_event_id,
        adapter_version=event.adapter_version,
        engine_run_ref=json.loads(event.engine_run_ref_json)
        if payloads and event.engine_run_ref_json is not None
        else None,
    )


_new_object = object.__new__
_set_attribute = object.__setattr__


def stored_from_fields(fields: dict[str, Any]) -> StoredEvent:
    """`StoredEvent(**fields)` for a dict of every one of its fields: an equal object, without the frozen
    dataclass's __init__, which sets each of the 17 fields through object.__setattr__ (5 us of the 20 us a
    feed row cost). StoredEvent has no __post_init__ and no slots; a test holds both."""
    event = _new_object(StoredEvent)
    _set_attribute(event, "__dict__", fields)
    return event


def row_to_event(
    row: Sequence[Any],
    decode_json: Callable[[Any], Any] = lambda value: value,
    decode_key: Callable[[Any], str] = lambda value: value,
) -> StoredEvent:
    """A StoredEvent from a row of the event columns, which both backends select in this order.
    `decode_json` turns the backend's JSON columns into values (psycopg has already done it), and
    `decode_key` the stored idempotency key into its text (Postgres stores bytes)."""
    (
        run_id,
        run_seq,
        event_id,
        step_id,
        engine_attempt_id,
        logical_attempt_id,
        plan_version,
        event_type,
        data,
        key,
        caused_by,
        parent,
        emitted_at,
        persisted_at,
        adapter_version,
        ref,
        position,
    ) = row
    return stored_from_fields(
        {
            "run_id": run_id,
            "run_seq": int(run_seq),
            "event_type": event_type,
            "emitted_at": emitted_at,
            "persisted_at": persisted_at,
            "idempotency_key": decode_key(key),
            "event_id": str(event_id),
            "data": decode_json(data) if data is not None else None,
            "step_id": step_id,
            "engine_attempt_id": engine_attempt_id,
            "logical_attempt_id": logical_attempt_id,
            "plan_version": plan_version,
            "caused_by_signal_id": str(caused_by) if caused_by else None,  # Postgres returns UUIDs
            "parent_event_id": str(parent) if parent else None,
            "adapter_version": adapter_version,
            "engine_run_ref": decode_json(ref) if ref is not None else None,
            "position": int(position) if position is not None else None,
        }
    )


def validate_imported(
    run_id: str, events: Sequence[StoredEvent], max_bytes: int
) -> list[tuple[int, ValidEvent]]:
    """Stored events from another store pass the same edge validation as new ones, and a batch gives each
    key one seq and each seq one key (the same event twice is one event)."""
    as_new = [stored_to_new(e) for e in events]
    valid = validate_batch(run_id, as_new, max_event_bytes=max_bytes)
    seq_of_key: dict[Any, int] = {}
    seqs: set[int] = set()
    once: list[tuple[int, ValidEvent]] = []
    for index, (event, checked) in enumerate(zip(events, valid, strict=True)):
        if not isinstance(event.run_seq, int) or event.run_seq < 1:
            raise InvalidEvent(
                "run_seq", f"must be a positive integer, got {event.run_seq!r}", run_id=run_id, index=index
            )
        key, seq = checked.idempotency_key, event.run_seq
        if key in seq_of_key:
            if seq_of_key[key] != seq:
                raise InvalidEvent(
                    "idempotency_key",
                    f"seq {seq} has the key of seq {seq_of_key[key]} in the same batch; nothing was written",
                    run_id=run_id,
                    index=index,
                )
            continue  # the same event again
        if seq in seqs:
            raise InvalidEvent(
                "run_seq",
                f"{seq} is given to two events with different keys; nothing was written",
                run_id=run_id,
                index=index,
            )
        seq_of_key[key] = seq
        seqs.add(seq)
        once.append((seq, checked))
    return once


def stored_to_new(event: StoredEvent) -> NewEvent:
    return NewEvent(
        run_id=event.run_id,
        event_type=event.event_type,
        emitted_at=event.emitted_at,
        data=event.data,
        step_id=event.step_id,
        engine_attempt_id=event.engine_attempt_id,
        logical_attempt_id=event.logical_attempt_id,
        plan_version=event.plan_version,
        event_id=event.event_id,
        idempotency_key=event.idempotency_key,
        caused_by_signal_id=event.caused_by_signal_id,
        parent_event_id=event.parent_event_id,
        adapter_version=event.adapter_version,
        engine_run_ref=event.engine_run_ref,
    )
