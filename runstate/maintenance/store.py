"""MaintenanceStore: the Postgres half of Iceberg maintenance, one facade over its concerns.

Each concern lives in its own module and works on the one shared connection provider (db.Database):
- queue.JobQueue: submit, fenced claims, heartbeats, action records, completion, cancel, reads;
- locks.TableLocks: per-table locks that follow the job under its fence;
- cache.CatalogCache: the catalog inventory submit() checks against;
- history.History: health snapshots and orchestrator audit rows;
- commit_fence: the trigger that refuses an Iceberg commit from a fenced-out attempt.

Nothing here imports dagster; the Dagster layer in runstate/defs/maintenance wraps this class.
"""

from __future__ import annotations

from runstate import migrations
from runstate.datastore import PostgresDatastore, check_schema_name
from runstate.maintenance import models
from runstate.maintenance.cache import CatalogCache
from runstate.maintenance.commit_fence import install_commit_fence
from runstate.maintenance.db import Database
from runstate.maintenance.errors import InvalidInput, InvalidStatus, JobNotFound, TableNotCached
from runstate.maintenance.history import History
from runstate.maintenance.locks import TableLocks
from runstate.maintenance.models import (  # noqa: F401 - re-exported
    ACTIVE_STATUSES,
    COMPLETION_STATUSES,
    DEFAULT_LEASE_SECONDS,
    JOB_STATUSES,
    ActionRecord,
    CachedTable,
    Claim,
    HealthSnapshot,
    Job,
    OrchestratorRun,
    TableRef,
)
from runstate.maintenance.queue import JobQueue
from runstate.maintenance.queue_sql import DEQUEUE_WITH_CLAIM_SQL  # noqa: F401 - kept importable here


class MaintenanceStore(JobQueue, TableLocks, CatalogCache, History):
    """Queue, fences, table locks, catalog cache, health rows and orchestrator audit in one Postgres schema.

    Safe to share between threads (a pool of autocommit connections); after a fork the child opens
    its own pool.
    """

    def __init__(self, dsn: str, *, schema: str = "runstate", max_attempts: int = 3) -> None:
        self.dsn = dsn
        try:
            self.schema = check_schema_name(schema)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidInput(f"max_attempts must be a positive integer, got {max_attempts!r}")
        JobQueue.__init__(self, Database(dsn, self.schema), max_attempts=max_attempts)
        self._fence_installed = False

    def close(self) -> None:
        """Close the connection pool (a later call opens a new one)."""
        self.db.close()

    def __enter__(self) -> MaintenanceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ensure_schema(self) -> None:
        """Create or upgrade the maintenance tables in `schema`; idempotent and safe to race."""
        datastore = PostgresDatastore(self.dsn, schema=self.schema)
        try:
            migrations.upgrade(datastore, "maintenance")
        finally:
            datastore.close()

    def ensure_commit_fence(self) -> bool:
        """Install the commit fence on the Iceberg JDBC catalog's table when it is in this database.

        False when there is no such table (a hadoop catalog, or one in another database): then only the
        queue's fences protect the table, which stop a zombie between actions but not inside one.
        """
        if not self._fence_installed:
            with self.db.connection() as conn:
                self._fence_installed = install_commit_fence(conn, self.schema)
        return self._fence_installed


# The value types and errors that lived here before the split stay importable from this module.
__all__ = ["InvalidStatus", "JobNotFound", "MaintenanceStore", "TableNotCached", *models.__all__]
