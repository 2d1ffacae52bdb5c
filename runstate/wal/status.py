"""WAL status per dataset (pending count, oldest pending age, last applied seq) and the lag figure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from runstate.wal import tables as t
from runstate.wal.producer import max_seq
from runstate.wal.source import last_applied_seqs


@dataclass(frozen=True)
class DatasetStatus:
    dataset_id: str
    pending_count: int
    oldest_pending_age_s: float | None
    last_applied_seq: int
    last_seq: int = 0


def wal_status(dynamodb: Any, table: str, now: datetime | None = None) -> list[DatasetStatus]:
    """One DatasetStatus per known dataset, sorted by id (Pending index + meta rows; no table scan)."""
    now_s = (now or datetime.now(timezone.utc)).timestamp()
    pending: dict[str, list[int]] = {}
    for dataset_id, created_at in _pending_rows(dynamodb, table):
        pending.setdefault(dataset_id, []).append(created_at)
    applied = last_applied_seqs(dynamodb, table)
    result = []
    for dataset_id in sorted(set(applied) | set(pending)):
        created = pending.get(dataset_id, [])
        result.append(
            DatasetStatus(
                dataset_id=dataset_id,
                pending_count=len(created),
                oldest_pending_age_s=max(0.0, now_s - min(created)) if created else None,
                last_applied_seq=applied.get(dataset_id, 0),
                last_seq=max_seq(dynamodb, table, dataset_id),
            )
        )
    return result


def oldest_pending_age_s(dynamodb: Any, table: str, now: datetime | None = None) -> float | None:
    """Age in seconds of the oldest Pending row over all datasets; None when nothing is pending."""
    page = dynamodb.query(
        TableName=table,
        IndexName=t.STATUS_INDEX,
        KeyConditionExpression="#status = :pending",
        ExpressionAttributeNames={"#status": t.STATUS_IDX},
        ExpressionAttributeValues={":pending": {"S": t.PENDING}},
        ScanIndexForward=True,
        Limit=1,
    )
    items = page.get("Items", [])
    if not items:
        return None
    now_s = (now or datetime.now(timezone.utc)).timestamp()
    return max(0.0, now_s - int(items[0][t.CREATED_AT]["N"]))


def _pending_rows(dynamodb: Any, table: str) -> list[tuple[str, int]]:
    request: dict[str, Any] = {
        "TableName": table,
        "IndexName": t.STATUS_INDEX,
        "KeyConditionExpression": "#status = :pending",
        "ExpressionAttributeNames": {"#status": t.STATUS_IDX},
        "ExpressionAttributeValues": {":pending": {"S": t.PENDING}},
    }
    rows = []
    while True:
        page = dynamodb.query(**request)
        rows.extend((item[t.DATASET_ID]["S"], int(item[t.CREATED_AT]["N"])) for item in page.get("Items", []))
        if "LastEvaluatedKey" not in page:
            return rows
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
