"""MaintenanceStore: the Postgres half of Iceberg maintenance, composed of one part per concern.

Every part works through one Database over the process's PostgresDatastore (runstate.datastore):
- queue (JobQueue): submit, fenced claims, heartbeats, action records, completion, cancel, reads;
- locks (TableLocks): per-table locks that follow the job under its fence;
- cache (CatalogCache): the catalog inventory submit() checks against;
- history (History): health snapshots and orchestrator audit rows;
- commit_fence: the trigger that refuses an Iceberg commit from a fenced-out attempt.
The store's public methods are the parts' methods, forwarded (docs/ARCHITECTURE.md's contract).

Nothing here imports dagster; the Dagster layer in runstate/defs/maintenance wraps this class.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from runstate import migrations
from runstate.datastore import PostgresDatastore, check_schema_name
from runstate.maintenance.cache import CatalogCache
from runstate.maintenance.commit_fence import install_commit_fence
from runstate.maintenance.db import APPLICATION_NAME, Database
from runstate.maintenance.errors import InvalidInput
from runstate.maintenance.history import History
from runstate.maintenance.locks import TableLocks
from runstate.maintenance.queue import JobQueue


def _forward(part: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """`store.name(...)` runs `store.<part>.name(...)`, with the part's signature and docstring."""

    @functools.wraps(method)
    def forwarded(self: MaintenanceStore, *args: Any, **kwargs: Any) -> Any:
        return getattr(getattr(self, part), method.__name__)(*args, **kwargs)

    forwarded.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
    return forwarded


class MaintenanceStore:
    """Queue, fences, table locks, catalog cache, health rows and orchestrator audit in one Postgres schema.

    Pass `datastore` to share a process's pool (its schema is then the store's); otherwise the store
    makes its own from `dsn` and `schema`. Safe to share between threads; after a fork the child opens
    its own pool.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = "runstate",
        max_attempts: int = 3,
        datastore: PostgresDatastore | None = None,
    ) -> None:
        if datastore is None and dsn is None:
            raise InvalidInput("MaintenanceStore needs a dsn or a datastore")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidInput(f"max_attempts must be a positive integer, got {max_attempts!r}")
        try:
            self.schema = check_schema_name(datastore.schema if datastore else schema)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        self.dsn = datastore.dsn if datastore else dsn
        self._owns_datastore = datastore is None
        self.db = Database(datastore or self._new_datastore())
        self.queue = JobQueue(self.db, max_attempts=max_attempts)
        self.locks = TableLocks(self.db)
        self.cache = CatalogCache(self.db)
        self.history = History(self.db)
        self._fence_installed = False

    @property
    def max_attempts(self) -> int:
        return self.queue.max_attempts

    def _new_datastore(self) -> PostgresDatastore:
        return PostgresDatastore(self.dsn, schema=self.schema, application_name=APPLICATION_NAME)

    def close(self) -> None:
        """Close the store's own pool (a later call opens a new one); a datastore passed in is its owner's."""
        if self._owns_datastore:
            self.db.datastore.close()
            self.db.datastore = self._new_datastore()

    def pinned(self) -> AbstractContextManager[None]:
        """Hold one connection for this thread's statements until the block ends: a worker's loop of
        claims and completions skips a pool checkout per statement."""
        return self.db.pinned()

    def __enter__(self) -> MaintenanceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ensure_schema(self) -> None:
        """Create or upgrade the maintenance tables in `schema`; idempotent and safe to race."""
        migrations.upgrade(self.db.datastore, "maintenance")

    def ensure_commit_fence(self) -> bool:
        """Install the commit fence on the Iceberg JDBC catalog's table when it is in this database.

        False when there is no such table (a hadoop catalog, or one in another database): then only the
        queue's fences protect the table, which stop a zombie between actions but not inside one.
        """
        if not self._fence_installed:
            with self.db.connection() as conn:
                self._fence_installed = install_commit_fence(conn, self.schema)
        return self._fence_installed

    # The parts' public methods, one line each.
    submit = _forward("queue", JobQueue.submit)
    claim = _forward("queue", JobQueue.claim)
    heartbeat = _forward("queue", JobQueue.heartbeat)
    holds_fence = _forward("queue", JobQueue.holds_fence)
    record_action = _forward("queue", JobQueue.record_action)
    complete = _forward("queue", JobQueue.complete)
    fail = _forward("queue", JobQueue.fail)
    is_cancel_requested = _forward("queue", JobQueue.is_cancel_requested)
    sweep_stale_claims = _forward("queue", JobQueue.sweep_stale_claims)
    claim_holders = _forward("queue", JobQueue.claim_holders)
    expire_leases_of = _forward("queue", JobQueue.expire_leases_of)
    cancel = _forward("queue", JobQueue.cancel)
    soft_delete = _forward("queue", JobQueue.soft_delete)
    get_job = _forward("queue", JobQueue.get_job)
    list_jobs = _forward("queue", JobQueue.list_jobs)
    active_job = _forward("queue", JobQueue.active_job)
    last_cadence_job = _forward("queue", JobQueue.last_cadence_job)
    last_action_at = _forward("queue", JobQueue.last_action_at)
    job_actions = _forward("queue", JobQueue.job_actions)
    queue_depth = _forward("queue", JobQueue.queue_depth)
    acquire_table_lock = _forward("locks", TableLocks.acquire_table_lock)
    release_table_lock = _forward("locks", TableLocks.release_table_lock)
    lock_for_claim = _forward("locks", TableLocks.lock_for_claim)
    unlock_for_claim = _forward("locks", TableLocks.unlock_for_claim)
    table_lock = _forward("locks", TableLocks.table_lock)
    sweep_expired_locks = _forward("locks", TableLocks.sweep_expired_locks)
    replace_table_cache = _forward("cache", CatalogCache.replace_table_cache)
    cached_tables = _forward("cache", CatalogCache.cached_tables)
    add_cached_table = _forward("cache", CatalogCache.add_cached_table)
    last_synced_at = _forward("cache", CatalogCache.last_synced_at)
    insert_health_snapshot = _forward("history", History.insert_health_snapshot)
    latest_health = _forward("history", History.latest_health)
    prune_health = _forward("history", History.prune_health)
    record_orchestrator_run = _forward("history", History.record_orchestrator_run)
    orchestrator_runs = _forward("history", History.orchestrator_runs)
