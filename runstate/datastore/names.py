"""The one rule for schema names: they are interpolated into DDL and session settings, so never quoted."""

from __future__ import annotations

import re

_SCHEMA_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class InvalidSchemaName(ValueError):
    """A schema name that would have to be quoted; refused before any SQL runs."""


def check_schema_name(schema: str) -> str:
    if not isinstance(schema, str) or not _SCHEMA_RE.fullmatch(schema):
        raise InvalidSchemaName(f"schema name {schema!r} must match {_SCHEMA_RE.pattern}")
    return schema
