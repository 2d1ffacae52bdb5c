"""The run history read without a JVM: pyiceberg's SqlCatalog on the JDBC catalog's own tables.

For whoever must not start Spark to read a little: run_history_sensor and its lag check (the feed
position the table has reached) and `LakeRunReader.read_run` (one run's events back from the lake,
for runs archived there). pyiceberg reads the catalog tables Spark's JdbcCatalog writes, under the
same catalog name, `lake`, and never creates them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runstate.eventstore.contract import InvalidEvent, StoredEvent
from runstate.eventstore.lake.arrow import events_from_arrow
from runstate.eventstore.lake.config import CATALOG, EVENTS_TABLE, RUNS_TABLE, HistoryConfig
from runstate.eventstore.lake.errors import HistoryError
from runstate.eventstore.lake.export import check_feed
from runstate.eventstore.lake.tables import POSITION_PROPERTY, first_position
from runstate.eventstore.validation import check_run_id

if TYPE_CHECKING:
    from runstate.spark import SparkSettings


class HistoryCatalog:
    """The `lake` catalog's tables, loaded by pyiceberg from the catalog database (no JVM)."""

    def __init__(self, pg_url: str, warehouse_dir: Path) -> None:
        self.pg_url = pg_url
        self.warehouse_dir = Path(warehouse_dir)
        self._catalog: Any = None

    @classmethod
    def from_spark_settings(cls, settings: SparkSettings) -> HistoryCatalog:
        """The catalog Spark's sessions use; HistoryError when that is not the JDBC catalog."""
        if not settings.is_jdbc or not settings.pg_url:
            raise HistoryError(
                "reading the run history without Spark needs the JDBC catalog (RUNSTATE_ICEBERG_CATALOG=jdbc "
                "and the Postgres JDBC driver: apt-get install libpostgresql-jdbc-java)"
            )
        return cls(settings.pg_url, settings.warehouse_dir)

    def catalog(self) -> Any:
        if self._catalog is None:
            from pyiceberg.catalog.sql import SqlCatalog

            uri = self.pg_url.replace("postgresql://", "postgresql+psycopg2://", 1)
            self._catalog = SqlCatalog(
                CATALOG, uri=uri, warehouse=self.warehouse_dir.resolve().as_uri(), init_catalog_tables="false"
            )
        return self._catalog

    def load(self, namespace: str, table: str) -> Any | None:
        """The pyiceberg table, or None when it (or the catalog itself) does not exist yet."""
        from pyiceberg.exceptions import NoSuchTableError
        from sqlalchemy.exc import SQLAlchemyError

        try:
            return self.catalog().load_table(f"{namespace}.{table}")
        except NoSuchTableError:
            return None
        except SQLAlchemyError as error:
            if "iceberg_tables" in str(error) and "does not exist" in str(error):
                return None
            raise HistoryError(
                f"the lake catalog could not be read: {' '.join(str(error).split())[:300]}"
            ) from None

    def close(self) -> None:
        if self._catalog is not None:
            self._catalog.engine.dispose()
            self._catalog = None


def table_position(table: Any | None) -> int:
    """The feed position a pyiceberg run_events table has reached (tables.py says where it lives)."""
    if table is None or table.current_snapshot() is None:
        return 0
    snapshot = table.current_snapshot()
    found = first_position(_ancestor_summaries(table, snapshot))
    if found is not None:
        return found
    # No export snapshot left (compacted, then expired): the largest position of the rows.
    return _largest(table, "position")


def runs_table_position(table: Any | None) -> int:
    """The feed position a pyiceberg runs table reflects: its position property, else its largest
    last_position (tables.py)."""
    if table is None:
        return 0
    recorded = table.properties.get(POSITION_PROPERTY)
    return int(recorded) if recorded is not None else _largest(table, "last_position")


def _largest(table: Any, column: str) -> int:
    """The largest value of a BIGINT column: from the data files' column bounds (no data read) when every
    file has one."""
    if table.current_snapshot() is None:
        return 0
    scan = table.scan(selected_fields=(column,))
    field_id = table.schema().find_field(column).field_id
    bounds = [task.file.upper_bounds.get(field_id) for task in scan.plan_files()]
    if all(bound is not None for bound in bounds):
        return max((int.from_bytes(bound, "little", signed=True) for bound in bounds), default=0)
    import pyarrow.compute as pc

    return int(pc.max(scan.to_arrow().column(column)).as_py() or 0)


def reached_position(catalog: HistoryCatalog, config: HistoryConfig) -> int:
    """The feed position the whole run history has reached: the lower of run_events' and runs' (an export
    that died between its commits and its merge leaves runs behind until the next export)."""
    events = table_position(catalog.load(config.namespace, EVENTS_TABLE))
    return min(events, runs_table_position(catalog.load(config.namespace, RUNS_TABLE)))


def _ancestor_summaries(table: Any, snapshot: Any) -> Any:
    while snapshot is not None:
        yield snapshot.summary or {}
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None


class LakeRunReader:
    """One run's events read back from `lake.<namespace>.run_events`, as the store's fetch gives them."""

    def __init__(self, catalog: HistoryCatalog, namespace: str = "runstate") -> None:
        self.catalog = catalog
        self.namespace = HistoryConfig(namespace=namespace).namespace

    def _table(self) -> Any | None:
        return self.catalog.load(self.namespace, EVENTS_TABLE)

    def position(self) -> int:
        """The feed position the lake has reached: every event at or below it is in the table."""
        return table_position(self._table())

    def read_run(self, run_id: str, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """The run's events with run_seq > after_seq, in seq order, at most `limit` (fetch's contract)."""
        from pyiceberg.expressions import And, EqualTo, GreaterThan

        check_run_id(run_id)
        for name, value, least in (("after_seq", after_seq, 0), ("limit", limit, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise InvalidEvent(
                    name, f"must be an integer of at least {least}, got {value!r}", run_id=run_id
                )
        table = self._table()
        if table is None:
            return []
        found = table.scan(
            row_filter=And(EqualTo("run_id", run_id), GreaterThan("run_seq", after_seq))
        ).to_arrow()
        return events_from_arrow(found.sort_by("run_seq").slice(0, limit))


@dataclass(frozen=True)
class HistoryLag:
    """How far the lake is behind the feed: the events after its position (counted up to one past the
    bound) and the commit time of the oldest of them."""

    position: int
    behind: int
    oldest_behind_at: datetime | None
    max_events: int
    max_minutes: int

    def age_s(self, now: datetime | None = None) -> float:
        if self.oldest_behind_at is None:
            return 0.0
        return max(0.0, ((now or datetime.now(UTC)) - self.oldest_behind_at).total_seconds())

    def passed(self, now: datetime | None = None) -> bool:
        return self.behind <= self.max_events and self.age_s(now) <= self.max_minutes * 60

    def describe(self, now: datetime | None = None) -> str:
        if not self.behind:
            return f"the run history is at the feed's end (position {self.position})"
        more = "more than " if self.behind > self.max_events else ""
        return (
            f"the run history is {more}{min(self.behind, self.max_events)} event(s) behind the feed "
            f"(position {self.position}); the oldest was committed {self.age_s(now):.0f} s ago"
        )


def history_lag(feed: Any, catalog: HistoryCatalog, config: HistoryConfig) -> HistoryLag:
    """The lag of the run history behind the feed: the events after its position (reached_position),
    counted up to max_events + 1 without reading them, and the first of them read."""
    check_feed(feed)
    position = reached_position(catalog, config)
    behind, _ = feed.feed_bound(position, config.max_lag_events + 1)
    first = feed.fetch_all(position, 1) if behind else []
    oldest = first[0].persisted_at.astimezone(UTC) if first else None
    return HistoryLag(position, behind, oldest, config.max_lag_events, config.max_lag_minutes)


# Pending events read to judge whether every one of them can wait (`export_due`).
DEFERRABLE_SCAN = 200


@dataclass(frozen=True)
class ExportDue:
    """The sensor's decision: `position` (where the next export starts) when one is due, else None and why."""

    position: int | None
    reason: str = ""


def export_due(
    feed: Any,
    catalog: HistoryCatalog,
    config: HistoryConfig,
    *,
    deferrable: Callable[[StoredEvent], bool] | None = None,
    now: datetime | None = None,
) -> ExportDue:
    """Due at the run history's position (reached_position) when the feed has an event after it.

    Not yet due while every such event is one `deferrable` accepts and the oldest is younger than half
    the lag bound (`max_lag_minutes`): they go with the next export, and the lag check never fails on
    them. The sensor defers the export runs' own events, which the run recorder appends: were they due
    at once, an idle deployment would export its last export's events once a minute for ever."""
    check_feed(feed)
    position = reached_position(catalog, config)
    pending = feed.fetch_all(position, DEFERRABLE_SCAN if deferrable is not None else 1)
    if not pending:
        return ExportDue(None, "the run history has every event of the feed")
    if deferrable is None or len(pending) == DEFERRABLE_SCAN or not all(map(deferrable, pending)):
        return ExportDue(position)
    age_s = ((now or datetime.now(UTC)) - pending[0].persisted_at).total_seconds()
    wait_s = config.max_lag_minutes * 30 - age_s
    if wait_s <= 0:
        return ExportDue(position)
    return ExportDue(
        None,
        f"only {len(pending)} event(s) of runs that can wait are pending: "
        f"they wait for other events, or {wait_s:.0f} s",
    )
