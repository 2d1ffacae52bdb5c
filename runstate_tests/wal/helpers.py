"""Small readers of the WAL table used by the assertions."""

from __future__ import annotations

from typing import Any

from runstate.wal import layout as t
from runstate.wal.table import WalTable


def wal_rows(dynamodb: Any, table: str, dataset_id: str) -> list[dict[str, Any]]:
    """Every WAL row (seq >= 1) of a dataset, consistent read, seq order."""
    return WalTable(dynamodb, table).query_rows(dataset_id)


def statuses(dynamodb: Any, table: str, dataset_id: str) -> dict[int, str]:
    return {int(i[t.SEQ_NO]["N"]): i[t.STATUS_IDX]["S"] for i in wal_rows(dynamodb, table, dataset_id)}


def item_count(dynamodb: Any, table: str) -> int:
    return dynamodb.scan(TableName=table, Select="COUNT", ConsistentRead=True)["Count"]


def object_keys(s3: Any, bucket: str) -> list[str]:
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys.extend(obj["Key"] for obj in page.get("Contents", []))
    return sorted(keys)
