"""The run history read without a JVM: pyiceberg's SqlCatalog on the JDBC catalog's own tables.

For whoever must not start Spark to read a little: run_history_sensor and its lag check (the feed
position the table has reached) and `LakeRunReader.read_run` (one run's events back from the lake,
for runs archived there). pyiceberg reads the catalog tables Spark's JdbcCatalog writes, under the
same catalog name, `lake`, and never creates them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runstate import defaults
from runstate.eventstore.contract import InvalidEvent, StoredEvent, one_line
from runstate.eventstore.lake.arrow import events_from_arrow
from runstate.eventstore.lake.config import CATALOG, EVENTS_TABLE, RUNS_TABLE, HistoryConfig
from runstate.eventstore.lake.errors import HistoryError
from runstate.eventstore.lake.export import check_feed
from runstate.eventstore.lake.tables import OWNER_PROPERTY, POSITION_PROPERTY, check_owner, first_position
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
        except (OSError, ValueError) as error:  # its metadata file missing, or not Iceberg metadata
            raise HistoryError(
                f"{CATALOG}.{namespace}.{table}: its metadata could not be read: {_cause(error)}"
            ) from None

    def close(self) -> None:
        if self._catalog is not None:
            self._catalog.engine.dispose()
            self._catalog = None


def _cause(error: BaseException) -> str:
    return f"{type(error).__name__}: {one_line(error)}"[:400]


@contextmanager
def lake_reads(what: str) -> Iterator[None]:
    """A lake file that is missing, truncated or not what its metadata says (pyarrow's OSError, ArrowInvalid,
    a ValueError) becomes one HistoryError line naming `what` was read and the file; a HistoryError gets
    `what` in front."""
    try:
        yield
    except HistoryError as error:
        raise type(error)(f"{what}: {error}") from None
    except (OSError, ValueError) as error:
        raise HistoryError(f"{what}: the lake could not be read: {_cause(error)}") from None


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


def reached_position(catalog: HistoryCatalog, config: HistoryConfig, owner: str | None = None) -> int:
    """The feed position the whole run history has reached: the lower of run_events' and runs' (an export
    that died between its commits and its merge leaves runs behind until the next export). With `owner`,
    tables another store owns are refused (their position is in that store's feed)."""
    tables = [catalog.load(config.namespace, name) for name in (EVENTS_TABLE, RUNS_TABLE)]
    if owner is not None:
        for name, table in zip((EVENTS_TABLE, RUNS_TABLE), tables):
            if table is not None:
                ident = f"{CATALOG}.{config.namespace}.{name}"
                check_owner(ident, table.properties.get(OWNER_PROPERTY), owner, required=False)
    with lake_reads(f"the position of {config.events_table}"):
        return min(table_position(tables[0]), runs_table_position(tables[1]))


def _ancestor_summaries(table: Any, snapshot: Any) -> Any:
    while snapshot is not None:
        yield snapshot.summary or {}
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None


class LakeRunReader:
    """One run's events read back from `lake.<namespace>.run_events`, as the store's fetch gives them.

    `owner` (the reading store's name, set by the store): a table another store owns is refused."""

    def __init__(
        self, catalog: HistoryCatalog, namespace: str = defaults.SCHEMA, owner: str | None = None
    ) -> None:
        self.catalog = catalog
        self.namespace = HistoryConfig(namespace=namespace).namespace
        self.owner = owner

    @property
    def ident(self) -> str:
        return f"{CATALOG}.{self.namespace}.{EVENTS_TABLE}"

    def _table(self, *, required: bool = False) -> Any | None:
        table = self.catalog.load(self.namespace, EVENTS_TABLE)
        if table is not None and self.owner is not None:
            check_owner(self.ident, table.properties.get(OWNER_PROPERTY), self.owner, required=required)
        return table

    def position(self) -> int:
        """The feed position the lake has reached: every event at or below it is in the table."""
        with lake_reads(f"the position of {self.ident}"):
            return table_position(self._table())

    def owned_position(self) -> int:
        """position(), refused unless the table names this reader's owner (what an archive deletes by)."""
        if self.owner is None:
            raise HistoryError(f"{self.ident}: the store reading it has no name to check its owner against")
        with lake_reads(f"the position of {self.ident}"):
            return table_position(self._table(required=True))

    def read_run(self, run_id: str, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """The run's events with run_seq > after_seq, in seq order, at most `limit` (fetch's contract)."""
        from pyiceberg.expressions import And, EqualTo, GreaterThan

        check_run_id(run_id)
        for name, value, least in (("after_seq", after_seq, 0), ("limit", limit, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise InvalidEvent(
                    name, f"must be an integer of at least {least}, got {value!r}", run_id=run_id
                )
        with lake_reads(f"run {run_id!r}: reading {self.ident}"):
            table = self._table()
            if table is None:
                return []
            found = table.scan(
                row_filter=And(EqualTo("run_id", run_id), GreaterThan("run_seq", after_seq))
            ).to_arrow()
            return events_from_arrow(found.sort_by("run_seq").slice(0, limit))

    def read_runs(
        self, run_ids: Sequence[str], first: datetime, last: datetime
    ) -> dict[str, list[StoredEvent]]:
        """Every event of `run_ids` emitted from `first` to `last` (the table's day partitions: a read of
        old runs opens their days' files only), by run in seq order: what an archive compares with the rows
        it is about to delete."""
        from pyiceberg.expressions import And, GreaterThanOrEqual, In, LessThanOrEqual

        for run_id in run_ids:
            check_run_id(run_id)
        names = ", ".join(map(repr, run_ids[:5])) + (
            f" and {len(run_ids) - 5} more" if len(run_ids) > 5 else ""
        )
        with lake_reads(f"run(s) {names}: reading {self.ident}"):
            table = self._table(required=True)
            if table is None:
                return {}
            window = And(
                GreaterThanOrEqual("emitted_at", first.astimezone(UTC).isoformat()),
                LessThanOrEqual("emitted_at", last.astimezone(UTC).isoformat()),
            )
            found = table.scan(row_filter=And(In("run_id", list(run_ids)), window)).to_arrow()
            events = events_from_arrow(found.sort_by([("run_id", "ascending"), ("run_seq", "ascending")]))
        runs: dict[str, list[StoredEvent]] = {}
        for event in events:
            runs.setdefault(event.run_id, []).append(event)
        return runs


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
    position = reached_position(catalog, config, feed.lake_owner())
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
    position = reached_position(catalog, config, feed.lake_owner())
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
