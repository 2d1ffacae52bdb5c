"""Changes, their canonical encoding and the plain fold that every reader path shares."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from runstate.wal.errors import WalEncodingError, WalInputError

# Matched with fullmatch: `$` would let a trailing newline through (into S3 keys, where it breaks flushes).
DATASET_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
CLIENT_TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_.:@/+=-]{1,128}")
MAX_KEY_CHARS = 1024
# Deeper JSON would hit Python's recursion limit in json.dumps/loads (about 1000 levels) and readers'
# parsers (Spark's, say) have limits of their own; real documents nest a few levels.
MAX_VALUE_DEPTH = 64
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UPSERT, DELETE = "upsert", "delete"

Key = str | int


def validate_dataset_id(dataset_id: Any) -> str:
    """Dataset ids go into S3 keys, run keys and tags: letters, digits, '_', '.', '-', 1-63 chars."""
    if not isinstance(dataset_id, str) or not DATASET_ID_PATTERN.fullmatch(dataset_id):
        raise WalInputError(
            f"dataset id {dataset_id!r} is invalid: it must match {DATASET_ID_PATTERN.pattern} "
            "(a letter or digit, then up to 62 letters, digits, '_', '.', '-')"
        )
    return dataset_id


def validate_client_token(token: Any) -> str:
    if not isinstance(token, str) or not CLIENT_TOKEN_PATTERN.fullmatch(token):
        raise WalInputError(
            f"client token {token!r} is invalid: it must match {CLIENT_TOKEN_PATTERN.pattern}"
        )
    return token


def validate_key(key: Any) -> Key:
    # bool is an int subclass, but True and 1 would fold onto the same key: reject it.
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise WalInputError(f"change key {key!r} has type {type(key).__name__}: keys must be str or int")
    if isinstance(key, int) and not INT64_MIN <= key <= INT64_MAX:
        raise WalInputError(f"change key {key} is outside the signed 64-bit range")
    if isinstance(key, str):
        if not 1 <= len(key) <= MAX_KEY_CHARS:
            raise WalInputError(f"change key {key[:40]!r} must be 1 to {MAX_KEY_CHARS} characters long")
        check_utf8(key, f"change key {key[:40]!r}")
    return key


def check_utf8(text: str, what: str) -> None:
    """A lone surrogate ('\\ud800') is a valid Python str but no UTF-8 (so no DynamoDB string) can hold it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise WalEncodingError(
            f"{what} contains {text[error.start : error.end]!r} at position {error.start}, "
            "which UTF-8 cannot encode (a lone surrogate)"
        ) from None


def check_depth(value: Any, what: str) -> None:
    """Refuse JSON nested deeper than MAX_VALUE_DEPTH, walking iteratively (no recursion to overflow)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth > MAX_VALUE_DEPTH:
                raise WalInputError(f"{what} is nested deeper than {MAX_VALUE_DEPTH} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def encode_value(key: Key, value: Any) -> str:
    """The value's canonical JSON, or WalInputError (never RecursionError or UnicodeEncodeError)."""
    what = f"value of key {key!r}"
    check_depth(value, what)
    try:
        encoded = canonical_json(value)
    except (TypeError, ValueError) as error:
        raise WalInputError(f"{what} is not JSON-serialisable: {error}") from None
    check_utf8(encoded, what)
    return encoded


def parse_upsert(text: str) -> Change:
    """`KEY=JSON` (the CLI's --upsert) -> Change.upsert(KEY, value); the key is always a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise WalInputError(f"--upsert {text[:60]!r} is not KEY=JSON")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise WalInputError(f"value of key {key!r} is nested deeper than {MAX_VALUE_DEPTH} levels") from None
    except ValueError:
        raise WalInputError(f"value of {key!r} is not JSON: {raw[:60]!r}") from None
    return Change.upsert(key, value)


def canonical_json(value: Any) -> str:
    """One spelling per value (sorted keys, no spaces, no NaN), so the same change gives the same bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Change:
    """One change to a dataset: an upsert of key -> value, or a delete of key."""

    op: str
    key: Key
    value: Any = None

    @classmethod
    def upsert(cls, key: Key, value: Any) -> Change:
        validate_key(key)
        encoded = encode_value(key, value)
        # Keep the value as a reader will see it (tuples become lists...), so folds compare equal.
        return cls(UPSERT, key, json.loads(encoded))

    @classmethod
    def delete(cls, key: Key) -> Change:
        validate_key(key)
        return cls(DELETE, key, None)

    def as_record(self) -> list[Any]:
        return [self.op, self.key] if self.op == DELETE else [self.op, self.key, self.value]

    @classmethod
    def from_record(cls, record: list[Any]) -> Change:
        if record[0] == UPSERT:
            return cls(UPSERT, record[1], record[2])
        if record[0] == DELETE:
            return cls(DELETE, record[1], None)
        raise ValueError(f"unknown change op {record[0]!r}")


def encode_changes(changes: Iterable[Change]) -> str:
    """The WAL row payload: canonical JSON of [[op, key, value?], ...]."""
    return canonical_json([change.as_record() for change in changes])


def decode_changes(payload: str) -> list[Change]:
    return [Change.from_record(record) for record in json.loads(payload)]


def fold(state: Mapping[Key, Any], changes: Iterable[Change]) -> dict[Key, Any]:
    """The plain fold: upsert sets, delete removes; later changes win."""
    result = dict(state)
    for change in changes:
        if change.op == UPSERT:
            result[change.key] = change.value
        else:
            result.pop(change.key, None)
    return result
