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


class _TextArrayDumper(Dumper):
    format = Format.BINARY
    oid = _TEXT_ARRAY_OID

    def dump(self, obj: bytes) -> Buffer:
        return obj


class _TimestamptzArrayDumper(_TextArrayDumper):
    oid = _TIMESTAMPTZ_ARRAY_OID


psycopg.adapters.register_dumper(TextArray, _TextArrayDumper)
psycopg.adapters.register_dumper(TimestamptzArray, _TimestamptzArrayDumper)


def text_array(values: Sequence[str | None]) -> TextArray:
    parts = [b""]
    for value in values:
        if value is None:
            parts.append(_NULL)
        else:
            encoded = value.encode()
            parts.append(_LENGTH(len(encoded)))
            parts.append(encoded)
    parts[0] = _HEADER.pack(1, None in values, _TEXT_OID, len(values), 1)
    return TextArray(b"".join(parts))


def timestamptz_array(values: Sequence[datetime]) -> TimestamptzArray:
    """Timezone-aware datetimes (validation refuses naive ones)."""
    body = b"".join(_TIMESTAMP(8, (value - _PG_EPOCH) // _MICROSECOND) for value in values)
    return TimestamptzArray(_HEADER.pack(1, 0, _TIMESTAMPTZ_OID, len(values), 1) + body)
