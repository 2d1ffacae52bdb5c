"""WAL status per dataset (pending count, oldest pending age, last applied seq) and the lag figure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from runstate.wal.table import WalTable


@dataclass(frozen=True)
class DatasetStatus:
    dataset_id: str
    pending_count: int
    oldest_pending_age_s: float | None
    last_applied_seq: int
    last_seq: int = 0


def wal_status(wal: WalTable, now: datetime | None = None) -> list[DatasetStatus]:
    """One DatasetStatus per known dataset, sorted by id (Pending index + meta rows; no table scan)."""
    now_s = (now or datetime.now(UTC)).timestamp()
    pending: dict[str, list[int]] = {}
    for row in wal.pending(limit=1_000_000):
        pending.setdefault(row.dataset_id, []).append(row.created_at)
    metas = wal.metas()
    result = []
    for dataset_id in sorted(set(metas) | set(pending)):
        created = pending.get(dataset_id, [])
        result.append(
            DatasetStatus(
                dataset_id=dataset_id,
                pending_count=len(created),
                oldest_pending_age_s=max(0.0, now_s - min(created)) if created else None,
                last_applied_seq=metas[dataset_id].last_applied_seq if dataset_id in metas else 0,
                last_seq=wal.max_seq(dataset_id),
            )
        )
    return result


def oldest_pending_age_s(wal: WalTable, now: datetime | None = None) -> float | None:
    """Age in seconds of the oldest Pending row over all datasets; None when nothing is pending."""
    oldest = wal.oldest_pending()
    if oldest is None:
        return None
    now_s = (now or datetime.now(UTC)).timestamp()
    return max(0.0, now_s - oldest.created_at)
