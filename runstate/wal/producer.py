"""The producer: appends a list of changes to a dataset's WAL as one row with the next SeqNo.

SeqNo assignment is one TransactWriteItems: bump the dataset's LastSeq from the value just read
(conditional), put the row (attribute_not_exists), and put the client-token row (attribute_not_exists).
So seqs are gapless per dataset, two writers can never share a seq, and a retried append with the same
client token returns the seq of the first one instead of writing a second row.
"""

from __future__ import annotations

import random
import time
from datetime import datetime, timezone
from typing import Any, Sequence

from botocore.exceptions import ClientError

from runstate.wal import tables as t
from runstate.wal.changes import (
    Change,
    encode_changes,
    DELETE,
    UPSERT,
    sha256_hex,
    validate_client_token,
    validate_dataset_id,
    validate_key,
)
from runstate.wal.errors import WalContentionError, WalInputError

__all__ = ["Change", "WalProducer", "MAX_PAYLOAD_BYTES", "ROW_TYPE_DELTA", "ROW_TYPE_SNAPSHOT"]

# DynamoDB's item limit is 400 KB including attribute names and the other attributes: keep 16 KB spare.
MAX_PAYLOAD_BYTES = 400 * 1024 - 16 * 1024
ROW_TYPE_DELTA = "DELTA"
ROW_TYPE_SNAPSHOT = "SNAPSHOT"
MAX_ATTEMPTS = 64


class WalProducer:
    """Appends changes to the WAL table `table` through a boto3 DynamoDB client."""

    def __init__(self, dynamodb_client: Any, table: str) -> None:
        self.dynamodb = dynamodb_client
        self.table = table

    def append(
        self,
        dataset_id: str,
        changes: Sequence[Change],
        client_token: str | None = None,
        *,
        now: datetime | None = None,
    ) -> int:
        """Append `changes` as one WAL row; returns its SeqNo. Bad input raises WalInputError, nothing written.

        With a `client_token`, a retry of the same append (same token, same changes) returns the first
        append's SeqNo; the same token with different changes is refused.
        """
        validate_dataset_id(dataset_id)
        if client_token is not None:
            validate_client_token(client_token)
        payload = _validated_payload(dataset_id, changes)
        checksum = sha256_hex(payload.encode("utf-8"))
        created_at = int((now or datetime.now(timezone.utc)).timestamp())
        if client_token is not None:
            existing = self._seq_for_token(dataset_id, client_token, checksum)
            if existing is not None:
                return existing
        for attempt in range(MAX_ATTEMPTS):
            last_seq = self._last_seq(dataset_id)
            outcome = self._try_append(dataset_id, last_seq, payload, checksum, created_at, client_token)
            if outcome is not None:
                return outcome
            # Lost the race for the counter: back off a little, with jitter, and read it again.
            time.sleep(min(0.2, 0.002 * (2 ** min(attempt, 7))) * random.random())
        raise WalContentionError(
            f"dataset {dataset_id!r}: gave up appending after {MAX_ATTEMPTS} attempts under write contention"
        )

    def _last_seq(self, dataset_id: str) -> int:
        item = self.dynamodb.get_item(
            TableName=self.table,
            Key={t.DATASET_ID: {"S": dataset_id}, t.SEQ_NO: {"N": str(t.META_SEQ)}},
            ConsistentRead=True,
            ProjectionExpression=t.LAST_SEQ,
        ).get("Item")
        return int(item[t.LAST_SEQ]["N"]) if item and t.LAST_SEQ in item else 0

    def _seq_for_token(self, dataset_id: str, client_token: str, checksum: str) -> int | None:
        item = self.dynamodb.get_item(
            TableName=self.table,
            Key={t.DATASET_ID: {"S": t.token_item_id(dataset_id, client_token)}, t.SEQ_NO: {"N": "0"}},
            ConsistentRead=True,
        ).get("Item")
        if not item:
            return None
        if item[t.CHECKSUM]["S"] != checksum:
            raise WalInputError(
                f"dataset {dataset_id!r}: client token {client_token!r} was already used for different changes "
                f"(seq {item[t.ASSIGNED_SEQ]['N']})"
            )
        return int(item[t.ASSIGNED_SEQ]["N"])

    def _try_append(
        self,
        dataset_id: str,
        last_seq: int,
        payload: str,
        checksum: str,
        created_at: int,
        client_token: str | None,
    ) -> int | None:
        """One transaction; the new seq, or None when another writer took `last_seq + 1` first."""
        seq = last_seq + 1
        meta_update = {
            "Update": {
                "TableName": self.table,
                "Key": {t.DATASET_ID: {"S": dataset_id}, t.SEQ_NO: {"N": str(t.META_SEQ)}},
                "UpdateExpression": "SET #last = :seq, #kind = :kind, #applied = if_not_exists(#applied, :zero)",
                "ConditionExpression": "attribute_not_exists(#last) OR #last = :expected",
                "ExpressionAttributeNames": {"#last": t.LAST_SEQ, "#kind": t.KIND, "#applied": t.LAST_APPLIED_SEQ},
                "ExpressionAttributeValues": {
                    ":seq": {"N": str(seq)},
                    ":expected": {"N": str(last_seq)},
                    ":kind": {"S": t.META_KIND},
                    ":zero": {"N": "0"},
                },
            }
        }
        row_put = {
            "Put": {
                "TableName": self.table,
                "Item": {
                    t.DATASET_ID: {"S": dataset_id},
                    t.SEQ_NO: {"N": str(seq)},
                    t.STATUS_IDX: {"S": t.PENDING},
                    t.TYPE: {"S": ROW_TYPE_DELTA},
                    t.CHECKSUM: {"S": checksum},
                    t.CREATED_AT: {"N": str(created_at)},
                    t.PAYLOAD: {"S": payload},
                },
                "ConditionExpression": "attribute_not_exists(#seq)",
                "ExpressionAttributeNames": {"#seq": t.SEQ_NO},
            }
        }
        items = [meta_update, row_put]
        if client_token is not None:
            items.append(
                {
                    "Put": {
                        "TableName": self.table,
                        "Item": {
                            t.DATASET_ID: {"S": t.token_item_id(dataset_id, client_token)},
                            t.SEQ_NO: {"N": "0"},
                            t.ASSIGNED_SEQ: {"N": str(seq)},
                            t.CHECKSUM: {"S": checksum},
                            t.CREATED_AT: {"N": str(created_at)},
                        },
                        "ConditionExpression": "attribute_not_exists(#seq)",
                        "ExpressionAttributeNames": {"#seq": t.SEQ_NO},
                    }
                }
            )
        try:
            self.dynamodb.transact_write_items(TransactItems=items)
        except ClientError as error:
            code = error.response["Error"]["Code"]
            if code not in ("TransactionCanceledException", "TransactionConflictException"):
                raise
            if client_token is not None:
                # A concurrent retry with the same token may have won: its seq is the answer.
                existing = self._seq_for_token(dataset_id, client_token, checksum)
                if existing is not None:
                    return existing
            return None
        return seq


def _validated_payload(dataset_id: str, changes: Sequence[Change]) -> str:
    if isinstance(changes, (str, bytes)) or not isinstance(changes, Sequence) or not changes:
        raise WalInputError(f"dataset {dataset_id!r}: changes must be a non-empty list of Change")
    for position, change in enumerate(changes):
        if not isinstance(change, Change):
            raise WalInputError(
                f"dataset {dataset_id!r}: change #{position} is a {type(change).__name__}, "
                "not a Change (use Change.upsert(key, value) or Change.delete(key))"
            )
        if change.op not in (UPSERT, DELETE):
            raise WalInputError(f"dataset {dataset_id!r}: change #{position} has unknown op {change.op!r}")
        validate_key(change.key)
    payload = encode_changes(changes)
    size = len(payload.encode("utf-8"))
    if size > MAX_PAYLOAD_BYTES:
        raise WalInputError(
            f"dataset {dataset_id!r}: payload of {size} bytes exceeds {MAX_PAYLOAD_BYTES} bytes "
            "(DynamoDB's 400 KB item limit); split the changes over several appends"
        )
    return payload
