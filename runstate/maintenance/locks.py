"""Per-table locks (`table_locks`): one maintenance job per table at a time.

A job's lock belongs to the job, not to one attempt: `holder` is the job id (as the seed's data model
says), and only the attempt holding the job's fence may take or refresh it. So a job's next attempt
takes over its dead predecessor's lock at once, while a fenced-out attempt can neither refresh nor
release it. The commit fence (commit_fence.py) checks the same rows at the Iceberg commit itself.
"""

from __future__ import annotations

from typing import Any

from runstate.maintenance.db import Database
from runstate.maintenance.identifiers import parse_table_ref
from runstate.maintenance.models import Claim
from runstate.maintenance.validation import non_empty_text, seconds

_UPSERT = """
ON CONFLICT (table_key) DO UPDATE SET
    holder = EXCLUDED.holder,
    acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > now()
                       THEN l.acquired_at ELSE now() END,
    expires_at = EXCLUDED.expires_at
WHERE l.expires_at <= now() OR l.holder = EXCLUDED.holder
RETURNING holder
"""
ACQUIRE_LOCK_SQL = (
    "INSERT INTO table_locks AS l (table_key, holder, acquired_at, expires_at)"
    " VALUES (%(table_key)s, %(holder)s, now(), now() + make_interval(secs => %(ttl_seconds)s))" + _UPSERT
)
# The claim's fence must hold (same attempt, live lease) for the job to take or refresh its lock.
ACQUIRE_FOR_CLAIM_SQL = (
    "INSERT INTO table_locks AS l (table_key, holder, acquired_at, expires_at)"
    " SELECT %(table_key)s, q.job_id, now(), now() + make_interval(secs => %(ttl_seconds)s)"
    " FROM job_queue q"
    " WHERE q.job_id = %(job_id)s AND q.attempt_id = %(attempt_id)s AND q.visible_at > now()" + _UPSERT
)
# Released unless another attempt of the job now holds a live fence (then the lock is that attempt's).
RELEASE_FOR_CLAIM_SQL = """
DELETE FROM table_locks l
WHERE l.table_key = %(table_key)s AND l.holder = %(job_id)s
  AND NOT EXISTS (
      SELECT 1 FROM job_queue q
      WHERE q.job_id = %(job_id)s AND q.attempt_id IS DISTINCT FROM %(attempt_id)s AND q.visible_at > now())
"""
RELEASE_LOCK_SQL = "DELETE FROM table_locks WHERE table_key = %s AND holder = %s"
SWEEP_LOCKS_SQL = "DELETE FROM table_locks WHERE expires_at <= now()"
GET_LOCK_SQL = (
    "SELECT holder, acquired_at, expires_at, expires_at > now() FROM table_locks WHERE table_key = %s"
)


class TableLocks:
    def __init__(self, db: Database) -> None:
        self.db = db

    def acquire_table_lock(self, table_key: str, holder: str, ttl_seconds: float) -> bool:
        """Take the table's lock until now + ttl. A live lock of another holder is never taken over;
        an expired one is. The current holder calling again extends its lease (a lock heartbeat)."""
        params = {
            "table_key": parse_table_ref(table_key).key,
            "holder": non_empty_text(holder, "lock holder"),
            "ttl_seconds": seconds(ttl_seconds, "ttl_seconds"),
        }
        return self.db.fetchone(ACQUIRE_LOCK_SQL, params) is not None

    def release_table_lock(self, table_key: str, holder: str) -> bool:
        """Release only when `holder` holds it; False otherwise (someone else's lock stays)."""
        return self.db.rowcount(RELEASE_LOCK_SQL, (parse_table_ref(table_key).key, holder)) == 1

    def lock_for_claim(self, claim: Claim, ttl_seconds: float) -> bool:
        """Take or refresh the lock of the claim's table for its job, while the claim's fence holds."""
        params = {**_claim_params(claim), "ttl_seconds": seconds(ttl_seconds, "ttl_seconds")}
        return self.db.fetchone(ACQUIRE_FOR_CLAIM_SQL, params) is not None

    def unlock_for_claim(self, claim: Claim) -> bool:
        return self.db.rowcount(RELEASE_FOR_CLAIM_SQL, _claim_params(claim)) == 1

    def table_lock(self, table_key: str) -> dict[str, Any] | None:
        """{holder, acquired_at, expires_at, live} of the table's lock row, or None."""
        row = self.db.fetchone(GET_LOCK_SQL, (parse_table_ref(table_key).key,))
        if row is None:
            return None
        return {"holder": row[0], "acquired_at": row[1], "expires_at": row[2], "live": row[3]}

    def sweep_expired_locks(self) -> int:
        return self.db.rowcount(SWEEP_LOCKS_SQL)


def _claim_params(claim: Claim) -> dict[str, Any]:
    return {"table_key": claim.ref.key, "job_id": claim.job_id, "attempt_id": claim.attempt_id}
