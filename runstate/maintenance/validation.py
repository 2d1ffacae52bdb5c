"""Checks of the values the store writes (durations, texts, flags, JSON options), before any SQL runs.

Each raises `InvalidInput` (a `MaintenanceError` and a `ValueError`) with a message that names the value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from runstate.maintenance.errors import InvalidInput
from runstate.maintenance.identifiers import validate_actions

# A lease or lock longer than a week is a typo, not a plan: it would park the job for that long.
MAX_SECONDS = 7 * 24 * 3600.0
# Options are a handful of small values; a bigger document is a mistake or an attack.
MAX_OPTIONS_BYTES = 4096
MAX_TEXT_CHARS = 200


def json_object(
    value: Mapping[str, Any] | None, what: str, max_bytes: int = MAX_OPTIONS_BYTES
) -> dict[str, Any]:
    """A JSON-serialisable dict with string keys, at most `max_bytes` encoded, or a clear InvalidInput."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{what} must be a mapping, got {type(value).__name__}")
    if not all(isinstance(key, str) for key in value):
        raise InvalidInput(f"{what} keys must be strings")
    try:
        text = json.dumps(dict(value), allow_nan=False, ensure_ascii=True)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInput(f"{what} must be JSON-serialisable: {type(exc).__name__}") from None
    if len(text) > max_bytes:
        raise InvalidInput(f"{what} is {len(text)} bytes of JSON; the limit is {max_bytes}")
    return json.loads(text)


def seconds(value: object, what: str, maximum: float = MAX_SECONDS) -> float:
    """A finite duration in [0, maximum]. Zero is allowed: a lease or lock that is expired at once."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"{what} must be a number of seconds, got {value!r}"[:MAX_TEXT_CHARS])
    if not 0 <= value <= maximum:
        raise InvalidInput(
            f"{what} must be between 0 and {maximum:g} seconds, got {value!r}"[:MAX_TEXT_CHARS]
        )
    return float(value)


def non_empty_text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip() or "\x00" in value or len(value) > 1000:
        raise InvalidInput(f"{what} must be a non-empty string (no NUL, at most 1000 characters)")
    return value


def free_text(value: object) -> str | None:
    """Free text for a TEXT column: Postgres refuses NUL and lone surrogates, a Spark error can carry both."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return text.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")


def flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{what} must be True or False, got {value!r}"[:MAX_TEXT_CHARS])
    return value


def positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"{what} must be a positive integer, got {value!r}"[:MAX_TEXT_CHARS])
    return value


def recommended_actions(actions: Iterable[str] | str | None) -> tuple[str, ...]:
    if actions is None or (not isinstance(actions, str) and not list(actions)):
        return ()
    return validate_actions(actions)
