"""MaintenanceStore: the Postgres half of Iceberg maintenance, composed of one part per concern.

Every part works through one Database over the process's PostgresDatastore (runstate.datastore):
- queue (JobQueue): submit, fenced claims, heartbeats, action records, completion, cancel, reads;
- locks (TableLocks): per-table locks that follow the job under its fence;
- cache (CatalogCache): the catalog inventory submit() checks against;
- history (History): health snapshots and orchestrator audit rows;
- commit_fence: the trigger that refuses an Iceberg commit from a fenced-out attempt.
Callers use the parts (`store.queue.list_jobs(...)`). The store's own methods are only the public
contract (docs/ARCHITECTURE.md): where a table or a job is given as plain values, they become a
TableRef and an ActionPlan, so the parts never parse one again.

Nothing here imports dagster; the Dagster layer in runstate/defs/maintenance wraps this class.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from runstate import defaults, migrations
from runstate.datastore import PostgresDatastore, check_schema_name
from runstate.maintenance.cache import CatalogCache
from runstate.maintenance.commit_fence import install_commit_fence
from runstate.maintenance.db import APPLICATION_NAME, Database
from runstate.maintenance.errors import InvalidInput
from runstate.maintenance.history import History
from runstate.maintenance.identifiers import TableRef, parse_table_ref
from runstate.maintenance.locks import TableLocks
from runstate.maintenance.models import DEFAULT_LEASE_SECONDS, DEFAULT_MAX_ATTEMPTS, Claim
from runstate.maintenance.plan import ActionPlan
from runstate.maintenance.queue import JobQueue


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
        schema: str = defaults.SCHEMA,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
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

    # The public contract: plain values in, validated once here, then the part.

    def submit(
        self,
        database: str,
        table: str,
        actions: Iterable[str] | str,
        dry_run: bool = False,
        options: Mapping[str, Any] | None = None,
    ) -> str:
        """Queue a job for `database.table`, or return the id of the job already pending/running for it.

        Everything is validated before any SQL runs: InvalidIdentifier / UnknownAction /
        InvalidActionOption (ValueErrors) for bad input, TableNotCached when the catalog cache does
        not list the table.
        """
        ref = TableRef(database, table)
        return self.queue.submit(ref, ActionPlan.parse(actions, dry_run=dry_run, options=options))

    def claim(self, worker: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> Claim | None:
        """JobQueue.claim: the oldest visible job under a fresh fence, or None."""
        return self.queue.claim(worker, lease_seconds)

    def heartbeat(self, claim: Claim, lease_seconds: float | None = None) -> bool:
        """JobQueue.heartbeat: False once the claim is fenced out."""
        return self.queue.heartbeat(claim, lease_seconds)

    def complete(self, claim: Claim, status: str, error: str | None = None) -> bool:
        """JobQueue.complete: False once the claim is fenced out."""
        return self.queue.complete(claim, status, error)

    def cancel(self, job_id: str) -> str:
        """JobQueue.cancel: "cancelled", "cancel_requested" or the terminal status the job had."""
        return self.queue.cancel(job_id)

    def acquire_table_lock(self, table_key: str, holder: str, ttl_seconds: float) -> bool:
        """TableLocks.acquire_table_lock of `database.table`."""
        return self.locks.acquire_table_lock(parse_table_ref(table_key), holder, ttl_seconds)

    def release_table_lock(self, table_key: str, holder: str) -> bool:
        """TableLocks.release_table_lock of `database.table`."""
        return self.locks.release_table_lock(parse_table_ref(table_key), holder)
