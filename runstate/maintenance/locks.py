"""Per-table locks (`table_locks`): one maintenance job per table at a time.

A job's lock belongs to the job, not to one attempt: `holder` is the job id (as the seed's data model
says), and only the attempt holding the job's fence may take or refresh it. So a job's next attempt
takes over its dead predecessor's lock at once, while a fenced-out attempt can neither refresh nor
release it. The commit fence (commit_fence.py) checks the same rows at the Iceberg commit itself.
"""

from __future__ import annotations

from typing import Any

from runstate import sqlfiles
from runstate.maintenance.db import Database
from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.models import Claim
from runstate.maintenance.validation import non_empty_text, seconds

_sql = sqlfiles.named("postgres", "maintenance", "locks.sql")


class TableLocks:
    """table_locks of one schema; tables come as TableRef, validated where the request entered."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def acquire_table_lock(self, ref: TableRef, holder: str, ttl_seconds: float) -> bool:
        """Take the table's lock until now + ttl. A live lock of another holder is never taken over;
        an expired one is. The current holder calling again extends its lease (a lock heartbeat)."""
        params = {
            "table_key": ref.key,
            "holder": non_empty_text(holder, "lock holder"),
            "ttl_seconds": seconds(ttl_seconds, "ttl_seconds"),
        }
        return self.db.fetchone(_sql("acquire_lock"), params) is not None

    def release_table_lock(self, ref: TableRef, holder: str) -> bool:
        """Release only when `holder` holds it; False otherwise (someone else's lock stays)."""
        return self.db.rowcount(_sql("release_lock"), (ref.key, holder)) == 1

    def lock_for_claim(self, claim: Claim, ttl_seconds: float) -> bool:
        """Take or refresh the lock of the claim's table for its job, while the claim's fence holds."""
        params = {**_claim_params(claim), "ttl_seconds": seconds(ttl_seconds, "ttl_seconds")}
        return self.db.fetchone(_sql("acquire_for_claim"), params) is not None

    def unlock_for_claim(self, claim: Claim) -> bool:
        return self.db.rowcount(_sql("release_for_claim"), _claim_params(claim)) == 1

    def table_lock(self, ref: TableRef) -> dict[str, Any] | None:
        """{holder, acquired_at, expires_at, live} of the table's lock row, or None."""
        row = self.db.fetchone(_sql("get_lock"), (ref.key,))
        if row is None:
            return None
        return {"holder": row[0], "acquired_at": row[1], "expires_at": row[2], "live": row[3]}

    def sweep_expired_locks(self) -> int:
        return self.db.rowcount(_sql("sweep_locks"))

    def any_expired_lock(self) -> bool:
        """Whether `sweep_expired_locks` would delete a lock now."""
        return bool(self.db.fetchone(_sql("any_expired_lock"))[0])


def _claim_params(claim: Claim) -> dict[str, Any]:
    return {"table_key": claim.ref.key, "job_id": claim.job_id, "attempt_id": claim.attempt_id}
