"""Validation at the store's edge: a NewEvent becomes a ValidEvent (JSON encoded once) or an InvalidEvent.

Every rule here exists because a store could not hold, or give back, what it was handed:
- text fields must be printable: control characters and ANSI escapes in a run id reach terminals
  raw, NUL is refused by Postgres, and a lone surrogate cannot be encoded as UTF-8;
- `emitted_at` must be timezone-aware, with an offset of whole minutes, and inside year 1..9999 in
  UTC with a day to spare: Postgres stores year 0 and year 10000, but psycopg cannot read them back;
- JSON payloads must encode, stay within `max_event_bytes` and MAX_JSON_DEPTH levels of nesting,
  and hold no NUL character (JSONB refuses `\\u0000`; the six-character text `\\u0000` is fine).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from itertools import chain, repeat
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from operator import attrgetter, is_
from typing import Any, NamedTuple

from runstate.eventstore.contract import (
    DEFAULT_MAX_EVENT_BYTES,
    MAX_RUN_ID_CHARS,
    InvalidEvent,
    NewEvent,
)

MAX_TEXT_CHARS = 256
MAX_KEY_CHARS = 512
MAX_JSON_DEPTH = 100
# A feed position packs the writing transaction's id with the event's place in its batch (20 bits).
MAX_BATCH_EVENTS = (1 << 20) - 1
EARLIEST_EMITTED_AT = datetime(1, 1, 2, tzinfo=UTC)
LATEST_EMITTED_AT = datetime(9999, 12, 30, tzinfo=UTC)

_OPTIONAL_TEXT = ("step_id", "engine_attempt_id", "logical_attempt_id", "plan_version", "adapter_version")
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# An escaped NUL in JSON text: `\u0000` preceded by an even number of backslashes (`\\u0000` is text).
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

# One encoder for every payload: json.dumps with any non-default argument builds a new one per call.
_JSON_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def _reused_c_encoder() -> Callable[[Any], str]:
    """The same encoding as _JSON_ENCODER.encode, for the batch path: JSONEncoder.encode builds its C
    encoder anew on every call, which costs as much as encoding a small payload. Without cycle
    markers, a cyclic value ends in RecursionError, and the batch path then hands the batch to
    validate_event, whose encoder names the cycle."""
    if c_make_encoder is None:  # an interpreter without the C accelerator
        return _JSON_ENCODER.encode
    encode = c_make_encoder(
        None, _JSON_ENCODER.default, encode_basestring, None, ":", ",", False, False, False
    )
    return lambda value: "".join(encode(value, 0))


_encode_json_fast = _reused_c_encoder()

Bad = Callable[[str, str], InvalidEvent]


class ValidEvent(NamedTuple):
    """A NewEvent that passed validation, with its JSON already encoded (stores bind these).
    A NamedTuple: it is built once per appended event, where a frozen dataclass costs several times
    as much."""

    run_id: str
    event_type: str
    emitted_at: datetime
    data_json: str | None
    step_id: str | None
    engine_attempt_id: str | None
    logical_attempt_id: str | None
    plan_version: str | None
    event_id: str
    idempotency_key: str
    caused_by_signal_id: str | None
    parent_event_id: str | None
    adapter_version: str | None
    engine_run_ref_json: str | None


def validate_event(
    event: NewEvent,
    *,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    index: int | None = None,
    checked_run_id: str | None = None,
) -> ValidEvent:
    """Check one event at the edge; raise InvalidEvent naming the field, touching nothing.
    `checked_run_id`: a run id that already passed check_run_id (the batch's), not checked again."""
    if not isinstance(event, NewEvent):
        raise InvalidEvent("event", f"expected a NewEvent, got {type(event).__name__}", index=index)
    run_id = event.run_id
    if checked_run_id is None or type(run_id) is not str or run_id != checked_run_id:
        check_run_id(run_id, index=index)

    def bad(field_name: str, message: str) -> InvalidEvent:
        return InvalidEvent(field_name, message, run_id=run_id, index=index)

    if not isinstance(event.event_type, str) or not event.event_type.strip():
        raise bad("event_type", "must be a non-empty string")
    _check_text(event.event_type, "event_type", MAX_TEXT_CHARS, bad)
    for name in _OPTIONAL_TEXT:
        value = getattr(event, name)
        if value is not None:
            _check_text(value, name, MAX_TEXT_CHARS, bad)
    key = event.idempotency_key
    if not isinstance(key, str) or not key:
        raise bad("idempotency_key", "must be a non-empty string")
    _check_text(key, "idempotency_key", MAX_KEY_CHARS, bad)
    return ValidEvent(
        run_id=run_id,
        event_type=event.event_type,
        emitted_at=check_emitted_at(event.emitted_at, bad),
        data_json=encode_json(event.data, "data", bad, max_event_bytes),
        step_id=event.step_id,
        engine_attempt_id=event.engine_attempt_id,
        logical_attempt_id=event.logical_attempt_id,
        plan_version=event.plan_version,
        event_id=_uuid_text(event.event_id, "event_id", bad, required=True),
        idempotency_key=key,
        caused_by_signal_id=_uuid_text(event.caused_by_signal_id, "caused_by_signal_id", bad),
        parent_event_id=_uuid_text(event.parent_event_id, "parent_event_id", bad),
        adapter_version=event.adapter_version,
        engine_run_ref_json=encode_json(event.engine_run_ref, "engine_run_ref", bad, max_event_bytes),
    )


def validate_batch(
    run_id: str,
    events: Sequence[NewEvent],
    *,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    first_index: int = 0,
) -> list[ValidEvent]:
    """Validate a whole batch before any write: one bad event rejects the batch. `first_index`: the
    place of events[0] in the caller's batch, when this is a part of it (errors name that place)."""
    check_run_id(run_id)
    if len(events) > MAX_BATCH_EVENTS:
        raise InvalidEvent(
            "events", f"a batch holds at most {MAX_BATCH_EVENTS} events, got {len(events)}", run_id=run_id
        )
    valid = _validate_columns(run_id, events, max_event_bytes)
    return valid if valid is not None else _validate_events(run_id, events, max_event_bytes, first_index)


def _validate_events(
    run_id: str, events: Sequence[NewEvent], max_event_bytes: int, first_index: int = 0
) -> list[ValidEvent]:
    valid = []
    for index, event in enumerate(events, first_index):
        checked = validate_event(event, max_event_bytes=max_event_bytes, index=index, checked_run_id=run_id)
        if checked.run_id != run_id:
            raise InvalidEvent(
                "run_id", f"is {checked.run_id!r} but the batch is for run {run_id!r}", index=index
            )
        valid.append(checked)
    return valid


# NewEvent's fields in ValidEvent's order (data and engine_run_ref are encoded on the way).
_NEW_EVENT_ROW = attrgetter(*(name.removesuffix("_json") for name in ValidEvent._fields))
_CANONICAL_UUIDS = re.compile(f"(?:{_CANONICAL_UUID.pattern})+")
_NONE = type(None)


def _validate_columns(run_id: str, events: Sequence[NewEvent], max_bytes: int) -> list[ValidEvent] | None:
    """The batch checked column by column, in a few C calls per column instead of a dozen Python calls
    per event: the same rules as validate_event, on the common shapes only (exact str, datetime in UTC,
    canonical UUID text, ASCII JSON). None when anything is unusual or wrong: validate_event then looks
    at each event and names the field at fault. test_validation.py holds the two paths to one verdict."""
    if not events or set(map(type, events)) != {NewEvent}:
        return None
    columns = list(zip(*map(_NEW_EVENT_ROW, events), strict=True))
    run_ids, types, emitted, data, step, engine, logical, plan, ids, keys, caused, parent, adapter, ref = (
        columns
    )
    if set(map(type, run_ids)) != {str} or run_ids.count(run_id) != len(events):
        return None
    optional = list(
        chain.from_iterable(c for c in (step, engine, logical, plan, adapter) if not _all_none(c))
    )
    if None in optional:
        optional = [value for value in optional if value is not None]
    if not (
        _texts_ok(types, MAX_TEXT_CHARS)
        and all(map(str.strip, types))
        and _texts_ok(keys, MAX_KEY_CHARS)
        and all(keys)
        and _texts_ok(optional, MAX_TEXT_CHARS)
        and _utc_times_ok(emitted)
        and set(map(type, ids)) == {str}
        and set(map(len, ids)) == {36}
        and _CANONICAL_UUIDS.fullmatch("".join(ids))
        and _all_none(caused + parent)
    ):
        return None
    data_json, ref_json = _json_column(data, max_bytes), _json_column(ref, max_bytes)
    if data_json is None or ref_json is None:
        return None
    columns[3], columns[13] = data_json, ref_json
    return list(map(ValidEvent._make, zip(*columns)))


def _all_none(values: Sequence[Any]) -> bool:
    return set(map(type, values)) == {_NONE}


def _texts_ok(values: Sequence[Any], max_chars: int) -> bool:
    """_check_text's rules for a whole column: printable text is printable when joined, and back."""
    return not values or (
        set(map(type, values)) == {str}
        and max(map(len, values)) <= max_chars
        and "".join(values).isprintable()
    )


def _utc_times_ok(values: Sequence[Any]) -> bool:
    return (
        set(map(type, values)) == {datetime}
        and all(map(is_, map(attrgetter("tzinfo"), values), repeat(UTC)))
        and EARLIEST_EMITTED_AT <= min(values)
        and max(values) <= LATEST_EMITTED_AT
    )


def _json_column(values: Sequence[Any], max_bytes: int) -> Sequence[str | None] | None:
    """encode_json's rules for a whole column, on ASCII output: the texts, or None to look closer."""
    if _all_none(values):
        return values
    try:
        texts = [None if value is None else _encode_json_fast(value) for value in values]
    except (RecursionError, TypeError, ValueError):
        return None
    present = [text for text in texts if text is not None]
    joined = "".join(present)
    if not joined.isascii() or "\\u0000" in joined or max(map(len, present)) > max_bytes:
        return None
    if joined.count("[") + joined.count("{") > MAX_JSON_DEPTH and any(
        text.count("[") + text.count("{") > MAX_JSON_DEPTH for text in present
    ):
        return None
    return texts


def check_run_id(run_id: Any, *, index: int | None = None) -> str:
    """A run id is 1..MAX_RUN_ID_CHARS printable characters."""
    if not isinstance(run_id, str) or not run_id:
        raise InvalidEvent("run_id", "must be a non-empty string", index=index)
    if len(run_id) > MAX_RUN_ID_CHARS:
        raise InvalidEvent("run_id", f"is {len(run_id)} characters; at most {MAX_RUN_ID_CHARS}", index=index)
    if not run_id.isprintable():
        raise InvalidEvent("run_id", f"{_shown(run_id)} holds control characters or escapes", index=index)
    return run_id


def check_expected_last_seq(run_id: str, expected_last_seq: Any) -> None:
    """An append's optimistic concurrency check: None or a non-negative integer."""
    if expected_last_seq is None:
        return
    if not isinstance(expected_last_seq, int) or isinstance(expected_last_seq, bool) or expected_last_seq < 0:
        raise InvalidEvent(
            "expected_last_seq", f"must be a non-negative integer, got {expected_last_seq!r}", run_id=run_id
        )


def check_emitted_at(value: Any, bad: Bad) -> datetime:
    if not isinstance(value, datetime):
        raise bad("emitted_at", f"must be a datetime, got {type(value).__name__}")
    if value.tzinfo is UTC:  # the common case: no offset arithmetic
        utc = value
    else:
        offset = value.utcoffset()
        if offset is None:
            raise bad("emitted_at", "must be timezone-aware")
        if offset % timedelta(minutes=1):
            raise bad("emitted_at", f"has a UTC offset of {offset}; offsets are whole minutes")
        try:
            utc = value.astimezone(UTC)
        except OverflowError:  # year 0 or 10000 in UTC
            raise _out_of_range(value, bad) from None
    if not EARLIEST_EMITTED_AT <= utc <= LATEST_EMITTED_AT:
        raise _out_of_range(value, bad)
    return value


def _out_of_range(value: datetime, bad: Bad) -> InvalidEvent:
    return bad(
        "emitted_at",
        f"{value.isoformat()} is outside the storable range "
        f"{EARLIEST_EMITTED_AT.isoformat()} .. {LATEST_EMITTED_AT.isoformat()} (UTC)",
    )


def encode_json(value: Any, field_name: str, bad: Bad, max_bytes: int) -> str | None:
    """Compact JSON text of `value`, or InvalidEvent: unencodable, too deep, NUL, too large."""
    if value is None:
        return None
    try:
        text = _JSON_ENCODER.encode(value)
    except RecursionError:
        raise bad(field_name, f"is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except (TypeError, ValueError) as exc:
        raise bad(field_name, f"is not JSON-serialisable ({exc})") from None
    # Counting brackets (in C) bounds the depth from above: walk the value only when it might be deep.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and json_depth(value) > MAX_JSON_DEPTH:
        raise bad(field_name, f"is nested more than {MAX_JSON_DEPTH} levels deep")
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise bad(field_name, "must not contain NUL characters (JSONB rejects them)")
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise bad(field_name, "contains text that is not valid UTF-8 (a lone surrogate?)") from None
    if size > max_bytes:
        raise bad(field_name, f"is {size} bytes as JSON; the limit is {max_bytes}")
    return text


def json_depth(value: Any) -> int:
    """Nesting depth of lists and dicts, without recursion (a hostile value cannot blow the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _check_text(value: Any, field_name: str, max_chars: int, bad: Bad) -> None:
    if not isinstance(value, str):
        raise bad(field_name, f"must be a string or None, got {type(value).__name__}")
    if len(value) > max_chars:
        raise bad(field_name, f"is {len(value)} characters; at most {max_chars}")
    # Refuses NUL, control characters, ANSI escapes and lone surrogates (not printable) in one C call.
    if not value.isprintable():
        raise bad(field_name, f"{_shown(value)} holds control characters, escapes or invalid text")


def _shown(value: str) -> str:
    """A safe one-line rendering of hostile text for an error message."""
    return ascii(value[:64])


def _uuid_text(value: Any, field_name: str, bad: Bad, *, required: bool = False) -> str | None:
    if value is None:
        if required:
            raise bad(field_name, "is required")
        return None
    if isinstance(value, uuid.UUID):
        return str(value)
    if not isinstance(value, str):
        raise bad(field_name, f"must be a UUID, got {type(value).__name__}")
    if _CANONICAL_UUID.fullmatch(value):
        return value  # already str(uuid.UUID(value)) (NewEvent's default): skip parsing it per event
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise bad(field_name, f"{_shown(value)} is not a valid UUID") from None
