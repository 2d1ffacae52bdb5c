"""The job queue and its fences: submit, claim, heartbeat, record_action, complete, cancel, reads.

- `jobs` is the durable record; `job_queue` holds a row only while a job is in flight.
- Its SQL is sql/postgres/maintenance/queue.sql, named queries loaded by name.
- A claim is one `dequeue_with_claim` statement: it picks a visible row with FOR UPDATE SKIP LOCKED,
  writes a fresh attempt_id fence on both rows, bumps attempt_count and sets the lease
  (`visible_at = now() + lease`).
- Every later write of the worker (heartbeat, record_action, complete) matches that attempt_id and a
  live lease, so a worker whose lease expired (and whose job may now belong to someone else) changes
  nothing and is told so by a False return.
- A cancel of a running job is recorded as `status = 'cancelled'` with `completed_at` still NULL:
  the worker sees it between actions and completes the job as cancelled.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from runstate import sqlfiles
from runstate.maintenance.db import Database
from runstate.maintenance.errors import (
    InvalidInput,
    InvalidStatus,
    JobNotFound,
    TableNotCached,
    UnknownAction,
)
from runstate.maintenance.identifiers import APPLY_DELETES_ACTIONS, TableRef
from runstate.maintenance.models import (
    ACTIVE_STATUSES,
    COMPLETION_STATUSES,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    JOB_STATUSES,
    ActionRecord,
    Claim,
    Job,
)
from runstate.maintenance.plan import ActionPlan
from runstate.maintenance.validation import flag, free_text, json_object, non_empty_text, seconds

_CLAIM_ROUNDS = 16


_sql = sqlfiles.named("postgres", "maintenance", "queue.sql")


class JobQueue:
    """jobs, job_queue and job_actions of one schema, through the shared Database.

    Tables come as TableRef and jobs as ActionPlan, both validated where the request entered.
    """

    def __init__(self, db: Database, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> None:
        self.db = db
        self.max_attempts = max_attempts

    # -- submit ------------------------------------------------------------------------------------

    def submit(self, ref: TableRef, plan: ActionPlan) -> str:
        """Queue a job of `plan` for the table, or return the id of the job already pending/running for it.

        Raises TableNotCached, before anything is written, when the catalog cache does not list the table.
        """
        with self.db.transaction() as cur:
            # Serialises submits for one table, so "one active job per table" holds under concurrency.
            cur.execute(
                _sql("submit_lock"), (_advisory_key("runstate.maintenance.submit", self.db.schema, ref.key),)
            )
            cur.execute(_sql("table_is_cached"), (ref.database, ref.table))
            if cur.fetchone() is None:
                raise TableNotCached(
                    f"table {ref.key!r} is not in the catalog cache (table_cache_entries in schema "
                    f"{self.db.schema!r}); materialize table_inventory (or run `runstate maintenance sync`)"
                )
            cur.execute(_sql("active_job_id"), (ref.database, ref.table))
            existing = cur.fetchone()
            if existing is not None:
                return existing[0]
            job_id = str(uuid.uuid4())
            row = (
                job_id,
                ref.database,
                ref.table,
                list(plan.actions),
                plan.dry_run,
                Jsonb(dict(plan.options)),
            )
            cur.execute(_sql("insert_job"), row)
            cur.execute(_sql("enqueue_job"), (job_id,))
        return job_id

    # -- claim and the fenced writes ---------------------------------------------------------------

    def claim(self, worker: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> Claim | None:
        """Claim the oldest visible job (expired leases first, then new ones), or None when there is none.

        A claimed job whose last lease expired with no attempts left is failed on the spot (the reason
        in `error`), and a job cancelled while its worker died ends cancelled; neither is handed out.
        """
        worker = non_empty_text(worker, "worker")
        lease_seconds = seconds(lease_seconds, "lease_seconds")
        attempt_id = str(uuid.uuid4())
        params = {
            "worker": worker,
            "lease_seconds": lease_seconds,
            "attempt_id": attempt_id,
            "max_attempts": self.max_attempts,
        }
        job = self._claim_row(params)
        if job is None:
            return None
        job_id, database, table, actions, dry_run, options, attempt_count = job
        return Claim(
            job_id=job_id,
            attempt_id=attempt_id,
            ref=TableRef(database, table),
            plan=ActionPlan(tuple(actions), dry_run, options or {}),
            attempt_count=attempt_count,
            worker=worker,
            lease_seconds=lease_seconds,
        )

    def _claim_row(self, params: dict[str, Any]) -> Sequence[Any] | None:
        with self.db.cursor() as cur:
            for _ in range(_CLAIM_ROUNDS):
                *job, picked = cur.execute(_sql("dequeue_with_claim"), params).fetchone()
                if job[0] is not None:
                    return job
                if not picked:
                    return None
                # The row picked belonged to a job that must not run again (out of attempts, cancelled
                # with a dead worker): finish it now, so it fails the moment a claim meets it; look again.
                cur.execute(_sql("sweep_stale_claims"), {"max_attempts": self.max_attempts})
        return None  # only rows that must not run in every round: leave them to the sweep schedule

    def heartbeat(self, claim: Claim, lease_seconds: float | None = None) -> bool:
        """Extend the lease; False when the claim is fenced out or its lease already ran out (stop work)."""
        lease = seconds(lease_seconds if lease_seconds is not None else claim.lease_seconds, "lease_seconds")
        params = {"job_id": claim.job_id, "attempt_id": claim.attempt_id, "lease_seconds": lease}
        return self.db.rowcount(_sql("heartbeat"), params) == 1

    def holds_fence(self, claim: Claim) -> bool:
        params = {"job_id": claim.job_id, "attempt_id": claim.attempt_id}
        return self.db.fetchone(_sql("fence_holds"), params) is not None

    def record_action(
        self,
        claim: Claim,
        action: str,
        success: bool,
        message: str = "",
        error: str | None = None,
        elapsed_seconds: float = 0.0,
        *,
        before: Mapping[str, Any] | None = None,
        after: Mapping[str, Any] | None = None,
    ) -> bool:
        """Record one action's result under the claim's fence; False (nothing written) when fenced out.

        Retry-safe: recording the same action again in the same attempt writes nothing and returns True.
        `before` / `after` are the table's figures around the action (see actions.TableFigures).
        """
        if action not in claim.plan.actions:
            raise UnknownAction(
                f"job {claim.job_id}: {action!r} is not one of its actions {claim.plan.actions}"
            )
        params = {
            "job_id": claim.job_id,
            "attempt_id": claim.attempt_id,
            "action": action,
            "success": flag(success, "success"),
            "message": free_text(message) or "",
            "error": free_text(error),
            "elapsed_seconds": max(0.0, float(elapsed_seconds)),
            "before": Jsonb(json_object(before, "before figures")),
            "after": Jsonb(json_object(after, "after figures")),
        }
        with self.db.connection() as conn:
            if conn.execute(_sql("record_action"), params).fetchone() is not None:
                return True
            return conn.execute(_sql("fence_holds"), params).fetchone() is not None

    def complete(self, claim: Claim, status: str, error: str | None = None) -> bool:
        """Finish the job under the claim's fence: drop its queue row, set the terminal status.

        `status` is completed, failed or cancelled. False when fenced out (nothing changes). Repeating a
        completion that already succeeded with the same attempt and status returns True.
        """
        if status not in COMPLETION_STATUSES:
            raise InvalidStatus(
                f"job {claim.job_id}: completion status {status!r} is not one of {COMPLETION_STATUSES}"
            )
        params = {
            "job_id": claim.job_id,
            "attempt_id": claim.attempt_id,
            "status": status,
            "error": free_text(error),
        }
        with self.db.cursor() as cur:
            if cur.execute(_sql("complete"), params).fetchone() is not None:
                return True
            return cur.execute(_sql("completed_by_attempt"), params).fetchone() is not None

    def fail(self, claim: Claim, error: str) -> bool:
        """complete(claim, "failed", error)."""
        return self.complete(claim, "failed", error)

    def is_cancel_requested(self, claim: Claim) -> bool:
        row = self.db.fetchone(_sql("cancel_status"), (claim.job_id,))
        return row is not None and row[0] == "cancelled"

    def sweep_stale_claims(self) -> int:
        """Expired leases back to pending (fence cleared); out of attempts -> failed. Returns rows changed."""
        row = self.db.fetchone(_sql("sweep_stale_claims"), {"max_attempts": self.max_attempts})
        return int(row[0])

    def any_stale_claim(self) -> bool:
        """Whether a claim's lease has expired: `sweep_stale_claims` has something to do."""
        return bool(self.db.fetchone(_sql("any_stale_claim"))[0])

    def claim_holders(self, prefix: str) -> list[str]:
        """The workers whose name starts with `prefix` and that hold a live lease now."""
        rows = self.db.fetchall(_sql("claim_holders"), {"prefix": non_empty_text(prefix, "worker prefix")})
        return sorted(row[0] for row in rows)

    def expire_leases_of(self, workers: Iterable[str]) -> list[str]:
        """End the live leases of `workers` (known dead), so their jobs are claimable now; the job ids."""
        names = [non_empty_text(worker, "worker") for worker in workers]
        if not names:
            return []
        return [row[0] for row in self.db.fetchall(_sql("expire_leases_of"), {"workers": names})]

    # -- cancel / delete ---------------------------------------------------------------------------

    def cancel(self, job_id: str) -> str:
        """Cancel a job: "cancelled" when it was not running, "cancel_requested" when a live worker holds
        it (it stops between actions), else the terminal status it already had."""
        job_id = _job_id(job_id)
        with self.db.transaction() as cur:
            # Queue row first, then job row: the same order as complete(), so the two never deadlock.
            cur.execute(_sql("lock_queue_row"), (job_id,))
            queue_row = cur.fetchone()
            cur.execute(_sql("lock_job_row"), (job_id,))
            job_row = cur.fetchone()
            if job_row is None:
                raise JobNotFound(f"maintenance job {job_id!r} does not exist in schema {self.db.schema!r}")
            status, completed_at = job_row
            if status == "cancelled":
                return "cancelled" if completed_at is not None else "cancel_requested"
            if status not in ACTIVE_STATUSES:
                return status
            if status == "running" and queue_row and queue_row[0]:
                cur.execute(_sql("request_cancel"), (job_id,))
                return "cancel_requested"
            cur.execute(_sql("dequeue"), (job_id,))
            cur.execute(_sql("cancel_now"), (job_id,))
            return "cancelled"

    def soft_delete(self, job_id: str) -> bool:
        """Tombstone a job (hidden from live_jobs), cancelling it first if active; False if already gone."""
        self.cancel(job_id)
        return self.db.rowcount(_sql("soft_delete"), (job_id,)) == 1

    # -- reads -------------------------------------------------------------------------------------

    def get_job(self, job_id: str) -> Job | None:
        """The job, soft-deleted or not; None when unknown."""
        row = self.db.fetchone(_sql("get_job"), (_job_id(job_id),))
        return _job(row) if row else None

    def list_jobs(
        self,
        status: str | None = None,
        table: TableRef | None = None,
        limit: int = 100,
        include_deleted: bool = False,
    ) -> list[Job]:
        """Newest first (only `table`'s when given); from the live_jobs view unless include_deleted."""
        if status is not None and status not in JOB_STATUSES:
            raise InvalidStatus(f"job status {status!r} is not one of {JOB_STATUSES}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidInput(f"limit must be an integer from 1 to 10000, got {limit!r}")
        params = {
            "status": status,
            "database": table.database if table else None,
            "table": table.table if table else None,
            "limit": limit,
        }
        query = _sql("list_all_jobs") if include_deleted else _sql("list_live_jobs")
        return [_job(row) for row in self.db.fetchall(query, params)]

    def last_cadence_job(self, ref: TableRef) -> Job | None:
        """The table's newest job that counts against the orchestrator's cadence: any but one that
        only applies delete files (APPLY_DELETES_ACTIONS), which merges may need more often."""
        params = {"database": ref.database, "table": ref.table, "apply_deletes": list(APPLY_DELETES_ACTIONS)}
        row = self.db.fetchone(_sql("last_cadence_job"), params)
        return _job(row) if row else None

    def active_job(self, ref: TableRef) -> Job | None:
        """The pending or running job of a table, if any."""
        row = self.db.fetchone(_sql("active_job_id"), (ref.database, ref.table))
        return self.get_job(row[0]) if row else None

    def last_action_at(self, ref: TableRef, action: str) -> datetime | None:
        """When `action` last succeeded on the table for real (dry runs do not count), or None."""
        row = self.db.fetchone(_sql("last_action"), (ref.database, ref.table, action))
        return row[0] if row else None

    def job_actions(self, job_id: str) -> list[ActionRecord]:
        rows = self.db.fetchall(_sql("job_actions"), (_job_id(job_id),))
        return [ActionRecord(*row[:8], before=row[8] or {}, after=row[9] or {}) for row in rows]

    def queue_depth(self) -> tuple[int, int]:
        """(claimable now, all in flight)."""
        ready, total = self.db.fetchone(_sql("queue_depth"))
        return int(ready), int(total)


def _job_id(value: object) -> str:
    """Job ids are uuid text; anything else cannot name a job (and must not reach the driver as NUL)."""
    if not isinstance(value, str) or not value or len(value) > 64 or "\x00" in value:
        raise JobNotFound(f"maintenance job {str(value)[:64]!r} not found")
    return value


def _job(row: Sequence[Any]) -> Job:
    return Job(
        job_id=row[0],
        database=row[1],
        table=row[2],
        actions=tuple(row[3]),
        dry_run=row[4],
        status=row[5],
        submitted_at=row[6],
        started_at=row[7],
        completed_at=row[8],
        error=row[9],
        attempt_id=row[10],
        deleted_at=row[11],
        options=row[12] or {},
        attempt_count=row[13],
        claimed_by=row[14],
        visible_at=row[15],
    )


def _advisory_key(*parts: str) -> int:
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
