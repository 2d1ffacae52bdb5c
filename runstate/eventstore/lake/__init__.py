"""The run history in the lake: every event of the state store in Iceberg, exactly once, queryable.

`lake.<namespace>.run_events` holds every column of the store's run_events plus the feed `position`
(partitioned by day of `emitted_at`); `lake.<namespace>.runs` one row per run. `export_history(spark,
store, config)` moves the feed into them, on a SparkSession passed in; `LakeRunReader` reads a run
back without a JVM. Plain Python; never imports dagster or another domain.
"""

from runstate.eventstore.lake.config import HistoryConfig
from runstate.eventstore.lake.errors import FeedRefused, ForeignHistory, HistoryConflict, HistoryError
from runstate.eventstore.lake.export import (
    EventsCommitted,
    ExportStep,
    ExportTally,
    check_feed,
    export_history,
)
from runstate.eventstore.lake.reader import (
    ExportDue,
    HistoryCatalog,
    HistoryLag,
    LakeRunReader,
    export_due,
    history_lag,
)
from runstate.eventstore.lake.runs import RunsMerged
from runstate.eventstore.lake.tables import OWNER_PROPERTY, POSITION_PROPERTY

__all__ = [
    "OWNER_PROPERTY",
    "POSITION_PROPERTY",
    "EventsCommitted",
    "ExportDue",
    "ExportStep",
    "ExportTally",
    "FeedRefused",
    "ForeignHistory",
    "HistoryCatalog",
    "HistoryConfig",
    "HistoryConflict",
    "HistoryError",
    "HistoryLag",
    "LakeRunReader",
    "RunsMerged",
    "check_feed",
    "export_due",
    "export_history",
    "history_lag",
]
