"""The catalog cache (`table_cache_entries`, `table_cache_meta`): the inventory submit() checks against."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from runstate import sqlfiles
from runstate.maintenance.db import Database
from runstate.maintenance.errors import InvalidInput
from runstate.maintenance.models import CachedTable
from runstate.maintenance.validation import flag, json_object

_sql = sqlfiles.named("postgres", "maintenance", "cache.sql")


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
            payloads.append(_checked_payload(entry))
        columns = (
            [e.database for e in checked],
            [e.table for e in checked],
            [e.maintenance_enabled for e in checked],
            payloads,
        )
        with self.db.transaction() as cur:
            cur.execute(_sql("lock_cache"))
            cur.execute(_sql("clear_cache"))
            if checked:
                cur.execute(_sql("insert_cache"), columns)
            cur.execute(_sql("mark_synced"))
        return len(checked)

    def add_cached_table(self, entry: CachedTable) -> None:
        """Add or refresh one table between inventories (a table a merge just wrote, say); the next
        replace_table_cache decides again from the catalog."""
        payload = _checked_payload(entry)
        self.db.rowcount(
            _sql("upsert_cache"), (entry.database, entry.table, entry.maintenance_enabled, payload)
        )

    def cached_tables(self, enabled_only: bool = False) -> list[CachedTable]:
        query = _sql("enabled_cached_tables") if enabled_only else _sql("cached_tables")
        return [_cached(row) for row in self.db.fetchall(query)]

    def last_synced_at(self) -> datetime | None:
        row = self.db.fetchone(_sql("last_synced"))
        return row[0] if row else None


def _checked_payload(entry: CachedTable) -> Jsonb:
    """The entry's payload for the table, once its identifiers, flag and payload passed validation."""
    ref = entry.ref
    if entry.maintenance_enabled is not None:
        flag(entry.maintenance_enabled, f"maintenance_enabled of {ref.key!r}")
    return Jsonb(json_object(entry.payload, f"payload of {ref.key!r}", MAX_PAYLOAD_BYTES))


def _cached(row: Sequence[Any]) -> CachedTable:
    return CachedTable(database=row[0], table=row[1], maintenance_enabled=row[2], payload=row[3] or {})
