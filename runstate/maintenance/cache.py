"""The catalog cache (`table_cache_entries`, `table_cache_meta`): the inventory submit() checks against."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from runstate.maintenance.db import Database
from runstate.maintenance.errors import InvalidInput
from runstate.maintenance.models import CachedTable
from runstate.maintenance.validation import flag, json_object

# SHARE ROW EXCLUSIVE: one replace at a time, while readers keep seeing the previous inventory.
LOCK_CACHE_SQL = "LOCK TABLE table_cache_entries IN SHARE ROW EXCLUSIVE MODE"
CLEAR_CACHE_SQL = "DELETE FROM table_cache_entries"
INSERT_CACHE_SQL = (
    "INSERT INTO table_cache_entries (database_name, table_name, maintenance_enabled, payload)"
    " SELECT * FROM unnest(%s::text[], %s::text[], %s::bool[], %s::jsonb[])"
)
MARK_SYNCED_SQL = (
    "INSERT INTO table_cache_meta (id, last_synced_at) VALUES (1, now())"
    " ON CONFLICT (id) DO UPDATE SET last_synced_at = EXCLUDED.last_synced_at"
)
_CACHED_COLUMNS = "SELECT database_name, table_name, maintenance_enabled, payload FROM table_cache_entries"
CACHED_TABLES_SQL = _CACHED_COLUMNS + " ORDER BY database_name, table_name"
ENABLED_CACHED_TABLES_SQL = (
    _CACHED_COLUMNS + " WHERE maintenance_enabled = TRUE ORDER BY database_name, table_name"
)
LAST_SYNCED_SQL = "SELECT last_synced_at FROM table_cache_meta WHERE id = 1"
# Large inventories carry each table's properties; a megabyte per entry is far beyond any real one.
MAX_PAYLOAD_BYTES = 1 << 20


class CatalogCache:
    def __init__(self, db: Database) -> None:
        self.db = db

    def replace_table_cache(self, entries: Iterable[CachedTable]) -> int:
        """Swap the whole inventory in one transaction and stamp table_cache_meta.last_synced_at."""
        checked = list(entries)
        seen: set[tuple[str, str]] = set()
        payloads = []
        for entry in checked:
            ref = entry.ref
            if (ref.database, ref.table) in seen:
                raise InvalidInput(f"table {ref.key!r} appears twice in the catalog inventory")
            seen.add((ref.database, ref.table))
            if entry.maintenance_enabled is not None:
                flag(entry.maintenance_enabled, f"maintenance_enabled of {ref.key!r}")
            payloads.append(Jsonb(json_object(entry.payload, f"payload of {ref.key!r}", MAX_PAYLOAD_BYTES)))
        columns = (
            [e.database for e in checked],
            [e.table for e in checked],
            [e.maintenance_enabled for e in checked],
            payloads,
        )
        with self.db.transaction() as cur:
            cur.execute(LOCK_CACHE_SQL)
            cur.execute(CLEAR_CACHE_SQL)
            if checked:
                cur.execute(INSERT_CACHE_SQL, columns)
            cur.execute(MARK_SYNCED_SQL)
        return len(checked)

    def cached_tables(self, enabled_only: bool = False) -> list[CachedTable]:
        query = ENABLED_CACHED_TABLES_SQL if enabled_only else CACHED_TABLES_SQL
        return [_cached(row) for row in self.db.fetchall(query)]

    def last_synced_at(self) -> datetime | None:
        row = self.db.fetchone(LAST_SYNCED_SQL)
        return row[0] if row else None


def _cached(row: Sequence[Any]) -> CachedTable:
    return CachedTable(database=row[0], table=row[1], maintenance_enabled=row[2], payload=row[3] or {})
