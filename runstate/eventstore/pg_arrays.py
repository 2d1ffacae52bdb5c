"""The batch inserts' arrays in Postgres's binary array format, built in one pass per column.

psycopg's generic list dumper looks each list over (its element type, its dimensions) and dumps it
element by element through per-type dumpers: about 20 us per array before the first element, a third
of a one-event append's client time. The columns here have known types, so each is packed directly;
the server reads the result with array_recv exactly as it reads psycopg's.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg.adapt import Buffer, Dumper
from psycopg.pq import Format

_BYTEA_OID, _BYTEA_ARRAY_OID = 17, 1001
_TEXT_OID, _TEXT_ARRAY_OID = 25, 1009
_TIMESTAMPTZ_OID, _TIMESTAMPTZ_ARRAY_OID = 1184, 1185

_HEADER = struct.Struct("!iiIii")  # dimensions, has NULLs, element type, length, lower bound
_LENGTH = struct.Struct("!i").pack
_NULL = _LENGTH(-1)
_TIMESTAMP = struct.Struct("!iq").pack  # length 8, microseconds since 2000-01-01 UTC
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class TextArray(bytes):
    """A text[] in binary form."""


class TimestamptzArray(bytes):
    """A timestamptz[] in binary form."""


class ByteaArray(bytes):
    """A bytea[] in binary form."""


class _TextArrayDumper(Dumper):
    format = Format.BINARY
    oid = _TEXT_ARRAY_OID

    def dump(self, obj: bytes) -> Buffer:
        return obj


class _TimestamptzArrayDumper(_TextArrayDumper):
    oid = _TIMESTAMPTZ_ARRAY_OID


class _ByteaArrayDumper(_TextArrayDumper):
    oid = _BYTEA_ARRAY_OID


psycopg.adapters.register_dumper(TextArray, _TextArrayDumper)
psycopg.adapters.register_dumper(TimestamptzArray, _TimestamptzArrayDumper)
psycopg.adapters.register_dumper(ByteaArray, _ByteaArrayDumper)


def text_array(values: Sequence[str | None]) -> TextArray:
    return TextArray(_array(_TEXT_OID, [None if value is None else value.encode() for value in values]))


def bytea_array(values: Sequence[bytes]) -> ByteaArray:
    return ByteaArray(_array(_BYTEA_OID, values))


def _array(element_oid: int, values: Sequence[bytes | None]) -> bytes:
    parts = [_HEADER.pack(1, None in values, element_oid, len(values), 1)]
    for value in values:
        if value is None:
            parts.append(_NULL)
        else:
            parts.append(_LENGTH(len(value)))
            parts.append(value)
    return b"".join(parts)


def timestamptz_array(values: Sequence[datetime]) -> TimestamptzArray:
    """Timezone-aware datetimes (validation refuses naive ones)."""
    body = b"".join(_TIMESTAMP(8, (value - _PG_EPOCH) // _MICROSECOND) for value in values)
    return TimestamptzArray(_HEADER.pack(1, 0, _TIMESTAMPTZ_OID, len(values), 1) + body)
