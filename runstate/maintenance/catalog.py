"""The table inventory of the `lake` catalog, read through Spark (no Dagster here).

Lists every table with its properties and reads the per-table maintenance settings:
`runstate.maintenance.enabled` (opt-in; None when unset or unrecognised) and
`runstate.maintenance.cadence-hours` (how often the orchestrator may submit work for it).
Names that would not pass the identifier validator are reported, never interpolated.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runstate.maintenance.identifiers import InvalidIdentifier, TableRef, validate_identifier
from runstate.maintenance.models import CachedTable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

CATALOG = "lake"
ENABLED_PROPERTY = "runstate.maintenance.enabled"
CADENCE_PROPERTY = "runstate.maintenance.cadence-hours"
_TRUE = {"true", "1", "yes", "on", "enabled"}
_FALSE = {"false", "0", "no", "off", "disabled"}


def parse_enabled(value: str | None) -> bool | None:
    """The opt-in flag: True/False for the usual spellings, None when unset or unrecognised."""
    if value is None:
        return None
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    return None


def parse_cadence_hours(value: str | None) -> int | None:
    """Whole hours (0: no minimum interval), else None (a bad value must not stop the inventory)."""
    if value is None:
        return None
    try:
        hours = int(value.strip())
    except ValueError:
        return None
    return hours if hours >= 0 else None


@dataclass(frozen=True)
class CatalogTable:
    """One table of the catalog with its properties and maintenance settings."""

    database: str
    table: str
    properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def ref(self) -> TableRef:
        return TableRef(self.database, self.table)

    @property
    def key(self) -> str:
        return self.ref.key

    @property
    def maintenance_enabled(self) -> bool | None:
        return parse_enabled(self.properties.get(ENABLED_PROPERTY))

    @property
    def cadence_hours(self) -> int | None:
        return parse_cadence_hours(self.properties.get(CADENCE_PROPERTY))

    def cached(self) -> CachedTable:
        """The table_cache_entries row for this table."""
        return CachedTable(self.database, self.table, self.maintenance_enabled, self.payload())

    def payload(self) -> dict[str, Any]:
        """The JSON kept in table_cache_entries.payload."""
        return {
            "database": self.database,
            "table": self.table,
            "properties": dict(self.properties),
            "maintenance_cadence_hours": self.cadence_hours,
        }


@dataclass
class CatalogListing:
    tables: list[CatalogTable]
    # Names refused by the validator, and tables listed whose metadata cannot be read (each with why).
    skipped: list[str] = field(default_factory=list)


def table_properties(spark: SparkSession, ref: TableRef, catalog: str = CATALOG) -> dict[str, str]:
    rows = spark.sql(f"SHOW TBLPROPERTIES {ref.in_catalog(catalog)}").collect()
    return {row["key"]: row["value"] for row in rows}


def _reason(exc: Exception) -> str:
    """The JVM's own message (a Py4JJavaError's first line only names the py4j call)."""
    java = getattr(exc, "java_exception", None)
    return (str(java) if java is not None else str(exc)).splitlines()[0][:300]


def list_namespaces(spark: SparkSession, catalog: str = CATALOG) -> list[str]:
    validate_identifier(catalog, "catalog name")
    return [row[0] for row in spark.sql(f"SHOW NAMESPACES IN {catalog}").collect()]


def list_tables(spark: SparkSession, catalog: str = CATALOG) -> CatalogListing:
    """Every table in every top-level namespace, with its properties."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors.exceptions.captured import CapturedException

    listing = CatalogListing(tables=[])
    for namespace in list_namespaces(spark, catalog):
        try:
            validate_identifier(namespace, "namespace")
        except InvalidIdentifier:
            listing.skipped.append(namespace)
            continue
        for row in spark.sql(f"SHOW TABLES IN {catalog}.`{namespace}`").collect():
            name = row["tableName"]
            try:
                ref = TableRef(namespace, name)
            except InvalidIdentifier:
                listing.skipped.append(f"{namespace}.{name}")
                continue
            try:
                properties = table_properties(spark, ref, catalog)
            # Dropped meanwhile, or its metadata files are gone: named, and the rest is still listed.
            except (CapturedException, Py4JJavaError) as exc:
                listing.skipped.append(f"{ref} (unreadable: {_reason(exc)})")
                continue
            listing.tables.append(CatalogTable(ref.database, ref.table, properties))
    if listing.skipped:
        log.warning(
            "catalog %s: %d table(s) left out (not plain identifiers, or unreadable): %s",
            catalog,
            len(listing.skipped),
            ", ".join(listing.skipped),
        )
    return listing
