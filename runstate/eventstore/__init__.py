"""Run state store: an append-only, idempotent event log of workflow runs (core, no dagster).

from runstate.eventstore import PostgresEventStore, NewEvent, EventType
"""

from typing import TYPE_CHECKING

from runstate.config import DEFAULT_ARCHIVE_AFTER_DAYS
from runstate.eventstore.contract import (
    CANONICAL_EVENT_TYPES,
    DEFAULT_MAX_EVENT_BYTES,
    TERMINAL_EVENT_TYPES,
    AppendResult,
    ConcurrencyConflict,
    EventStoreError,
    EventType,
    InvalidEvent,
    MigrationReport,
    NewEvent,
    ProjectionReport,
    RunSnapshot,
    SnapshotCorrupt,
    StepState,
    StoredEvent,
    idempotency_key,
)
from runstate.eventstore.lake_archive import ArchiveHeldBack
from runstate.eventstore.projection import fold
from runstate.eventstore.resume import Resume
from runstate.eventstore.snapshots import SnapshotMetrics, SnapshotPolicy
from runstate.eventstore.store import EventStore
from runstate.eventstore.validation import (
    MAX_JSON_DEPTH,
    ValidEvent,
    validate_batch,
    validate_event,
)
from runstate.lazy import lazy_exports

if TYPE_CHECKING:
    from runstate.eventstore.migrate import migrate_events, verify_migration
    from runstate.eventstore.postgres import PostgresEventStore
    from runstate.eventstore.snowflake import SnowflakeEventStore

# The backends load their drivers (psycopg, the Snowflake connector): imported on first use, so that a
# module under runstate.eventstore (the CLI's `--help` reads feed.py) does not pay for them.
__getattr__ = lazy_exports(
    __name__,
    {
        "PostgresEventStore": "runstate.eventstore.postgres",
        "SnowflakeEventStore": "runstate.eventstore.snowflake",
        "migrate_events": "runstate.eventstore.migrate",
        "verify_migration": "runstate.eventstore.migrate",
    },
)


__all__ = [
    "CANONICAL_EVENT_TYPES",
    "DEFAULT_ARCHIVE_AFTER_DAYS",
    "DEFAULT_MAX_EVENT_BYTES",
    "TERMINAL_EVENT_TYPES",
    "AppendResult",
    "ArchiveHeldBack",
    "ConcurrencyConflict",
    "EventStore",
    "EventStoreError",
    "EventType",
    "InvalidEvent",
    "MAX_JSON_DEPTH",
    "MigrationReport",
    "NewEvent",
    "PostgresEventStore",
    "ProjectionReport",
    "Resume",
    "RunSnapshot",
    "SnapshotCorrupt",
    "SnapshotMetrics",
    "SnapshotPolicy",
    "SnowflakeEventStore",
    "StepState",
    "StoredEvent",
    "ValidEvent",
    "fold",
    "idempotency_key",
    "migrate_events",
    "validate_batch",
    "validate_event",
    "verify_migration",
]
