"""Changes, their canonical encoding and the plain fold that every reader path shares."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from runstate.wal.errors import WalInputError

DATASET_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
CLIENT_TOKEN_PATTERN = re.compile(r"^[A-Za-z0-9_.:@/+=-]{1,128}$")
MAX_KEY_CHARS = 1024
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UPSERT, DELETE = "upsert", "delete"

Key = str | int


def validate_dataset_id(dataset_id: Any) -> str:
    """Dataset ids go into S3 keys, run keys and tags: letters, digits, '_', '.', '-', 1-63 chars."""
    if not isinstance(dataset_id, str) or not DATASET_ID_PATTERN.match(dataset_id):
        raise WalInputError(
            f"dataset id {dataset_id!r} is invalid: it must match {DATASET_ID_PATTERN.pattern} "
            "(a letter or digit, then up to 62 letters, digits, '_', '.', '-')"
        )
    return dataset_id


def validate_client_token(token: Any) -> str:
    if not isinstance(token, str) or not CLIENT_TOKEN_PATTERN.match(token):
        raise WalInputError(f"client token {token!r} is invalid: it must match {CLIENT_TOKEN_PATTERN.pattern}")
    return token


def validate_key(key: Any) -> Key:
    # bool is an int subclass, but True and 1 would fold onto the same key: reject it.
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise WalInputError(f"change key {key!r} has type {type(key).__name__}: keys must be str or int")
    if isinstance(key, int) and not INT64_MIN <= key <= INT64_MAX:
        raise WalInputError(f"change key {key} is outside the signed 64-bit range")
    if isinstance(key, str) and not 1 <= len(key) <= MAX_KEY_CHARS:
        raise WalInputError(f"change key {key[:40]!r} must be 1 to {MAX_KEY_CHARS} characters long")
    return key


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
    def upsert(cls, key: Key, value: Any) -> "Change":
        validate_key(key)
        try:
            encoded = canonical_json(value)
        except (TypeError, ValueError) as error:
            raise WalInputError(f"value of key {key!r} is not JSON-serialisable: {error}") from None
        # Keep the value as a reader will see it (tuples become lists...), so folds compare equal.
        return cls(UPSERT, key, json.loads(encoded))

    @classmethod
    def delete(cls, key: Key) -> "Change":
        validate_key(key)
        return cls(DELETE, key, None)

    def as_record(self) -> list[Any]:
        return [self.op, self.key] if self.op == DELETE else [self.op, self.key, self.value]

    @classmethod
    def from_record(cls, record: list[Any]) -> "Change":
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
