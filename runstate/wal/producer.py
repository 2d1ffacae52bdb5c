"""The producer: appends a list of changes to a dataset's WAL as one row with the next SeqNo.

SeqNo assignment is a conditional PutItem of row (dataset, max+1) with attribute_not_exists: the row
itself is the claim, so two writers can never share a seq and seqs stay gapless (a crash can never
leave a reserved-but-unwritten seq behind, which a separate counter would). The highest row is never
trimmed, so "max existing seq" is always the true counter.

Why not TransactWriteItems (counter + row + token in one transaction)? It would work on DynamoDB, but
moto deep-copies the whole table for every item of every transaction, so appends slow down with table
size (28 ms -> 90 ms per append at a few hundred rows); this design needs no transaction at all.

Client tokens (a retried append never creates two rows): the token row ("#token#<dataset>#<token>", 0)
is claimed first with a conditional put that records the payload checksum and the highest seq at claim
time (Floor). Any writer completing that token (the first one, or a retry after a crash) scans the rows
above the last seq it has checked for a row carrying the token before each attempt, so once a row
with the token exists, no second one is written. The token row finally records AssignedSeq.
"""

from __future__ import annotations

import random
import time
from datetime import datetime, timezone
from typing import Any, Sequence

from botocore.exceptions import ClientError

from runstate.wal import tables as t
from runstate.wal.changes import (
    DELETE,
    UPSERT,
    Change,
    encode_changes,
    sha256_hex,
    validate_client_token,
    validate_dataset_id,
    validate_key,
)
from runstate.wal.errors import WalContentionError, WalInputError, WalIntegrityError

__all__ = ["Change", "WalProducer", "MAX_PAYLOAD_BYTES", "ROW_TYPE_DELTA", "ROW_TYPE_SNAPSHOT"]

# DynamoDB's item limit is 400 KB including attribute names and the other attributes: keep 16 KB spare.
MAX_PAYLOAD_BYTES = 400 * 1024 - 16 * 1024
ROW_TYPE_DELTA = "DELTA"
ROW_TYPE_SNAPSHOT = "SNAPSHOT"
MAX_ATTEMPTS = 200


class WalProducer:
    """Appends changes to the WAL table `table` through a boto3 DynamoDB client (thread-safe)."""

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
        row = _Row(dataset_id, payload, checksum, created_at, client_token)
        if client_token is None:
            return self._write_row(row, checked_upto=None)
        floor = self._max_seq(dataset_id)
        if self._claim_token(row, floor):
            return self._write_row(row, checked_upto=floor, known_top=floor)
        token = self._token_item(dataset_id, client_token, checksum)
        if token is None:  # the claim failed because the row exists, and token rows are never deleted
            raise WalIntegrityError(f"dataset {dataset_id!r}: client token {client_token!r} vanished while claimed")
        if t.ASSIGNED_SEQ in token:
            return int(token[t.ASSIGNED_SEQ]["N"])
        # Claimed but not finished (a crash, or a concurrent retry): finish it, scanning from the claim's floor.
        return self._write_row(row, checked_upto=int(token["Floor"]["N"]))

    # --- seq assignment ----------------------------------------------------------------------------------

    def _write_row(self, row: "_Row", checked_upto: int | None, known_top: int | None = None) -> int:
        """Put the row at max+1 (conditional) until it sticks; with a token, stop if a row already has it."""
        for attempt in range(MAX_ATTEMPTS):
            top = known_top if known_top is not None and attempt == 0 else self._max_seq(row.dataset_id)
            if row.client_token is not None and checked_upto is not None and top > checked_upto:
                existing = self._seq_with_token(row, checked_upto + 1, top)
                if existing is not None:
                    return self._record_token_seq(row, existing)
                checked_upto = top
            if top == 0:
                self._ensure_meta(row.dataset_id)
            seq = top + 1
            if self._put_row(row, seq):
                return self._record_token_seq(row, seq) if row.client_token is not None else seq
            # Lost the race for this seq: back off a little, with jitter, and look again.
            time.sleep(min(0.05, 0.001 * (2 ** min(attempt, 6))) * random.random())
        raise WalContentionError(
            f"dataset {row.dataset_id!r}: gave up appending after {MAX_ATTEMPTS} attempts under write contention"
        )

    def _max_seq(self, dataset_id: str) -> int:
        return max_seq(self.dynamodb, self.table, dataset_id)

    def _put_row(self, row: "_Row", seq: int) -> bool:
        item = {
            t.DATASET_ID: {"S": row.dataset_id},
            t.SEQ_NO: {"N": str(seq)},
            t.STATUS_IDX: {"S": t.PENDING},
            t.TYPE: {"S": ROW_TYPE_DELTA},
            t.CHECKSUM: {"S": row.checksum},
            t.CREATED_AT: {"N": str(row.created_at)},
            t.PAYLOAD: {"S": row.payload},
        }
        if row.client_token is not None:
            item[t.CLIENT_TOKEN] = {"S": row.client_token}
        return self._conditional_put(item)

    def _ensure_meta(self, dataset_id: str) -> None:
        """The meta row lists the dataset (Kind index) and carries LastAppliedSeq."""
        self.dynamodb.update_item(
            TableName=self.table,
            Key={t.DATASET_ID: {"S": dataset_id}, t.SEQ_NO: {"N": str(t.META_SEQ)}},
            UpdateExpression="SET #kind = :kind, #applied = if_not_exists(#applied, :zero)",
            ExpressionAttributeNames={"#kind": t.KIND, "#applied": t.LAST_APPLIED_SEQ},
            ExpressionAttributeValues={":kind": {"S": t.META_KIND}, ":zero": {"N": "0"}},
        )

    # --- client tokens -----------------------------------------------------------------------------------

    def _token_key(self, dataset_id: str, client_token: str) -> dict[str, Any]:
        return {t.DATASET_ID: {"S": t.token_item_id(dataset_id, client_token)}, t.SEQ_NO: {"N": "0"}}

    def _token_item(self, dataset_id: str, client_token: str, checksum: str) -> dict[str, Any] | None:
        item = self.dynamodb.get_item(
            TableName=self.table, Key=self._token_key(dataset_id, client_token), ConsistentRead=True
        ).get("Item")
        if item and item[t.CHECKSUM]["S"] != checksum:
            raise WalInputError(
                f"dataset {dataset_id!r}: client token {client_token!r} was already used for different changes"
            )
        return item

    def _claim_token(self, row: "_Row", floor: int) -> bool:
        assert row.client_token is not None
        item = {
            **self._token_key(row.dataset_id, row.client_token),
            t.CHECKSUM: {"S": row.checksum},
            "Floor": {"N": str(floor)},
            t.CREATED_AT: {"N": str(row.created_at)},
        }
        return self._conditional_put(item)

    def _seq_with_token(self, row: "_Row", first: int, last: int) -> int | None:
        request: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "#ds = :ds AND #seq BETWEEN :first AND :last",
            "FilterExpression": "#token = :token",
            "ExpressionAttributeNames": {"#ds": t.DATASET_ID, "#seq": t.SEQ_NO, "#token": t.CLIENT_TOKEN},
            "ExpressionAttributeValues": {
                ":ds": {"S": row.dataset_id}, ":first": {"N": str(first)}, ":last": {"N": str(last)},
                ":token": {"S": row.client_token},
            },
            "ProjectionExpression": "#seq",
            "ConsistentRead": True,
        }
        while True:
            page = self.dynamodb.query(**request)
            if page.get("Items"):
                return int(page["Items"][0][t.SEQ_NO]["N"])
            if "LastEvaluatedKey" not in page:
                return None
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _record_token_seq(self, row: "_Row", seq: int) -> int:
        assert row.client_token is not None
        try:
            self.dynamodb.update_item(
                TableName=self.table,
                Key=self._token_key(row.dataset_id, row.client_token),
                UpdateExpression="SET #assigned = :seq",
                ConditionExpression="attribute_not_exists(#assigned) OR #assigned = :seq",
                ExpressionAttributeNames={"#assigned": t.ASSIGNED_SEQ},
                ExpressionAttributeValues={":seq": {"N": str(seq)}},
            )
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            raise WalIntegrityError(
                f"dataset {row.dataset_id!r}: client token {row.client_token!r} is recorded with another seq than {seq}"
            ) from None
        return seq

    def _conditional_put(self, item: dict[str, Any]) -> bool:
        try:
            self.dynamodb.put_item(
                TableName=self.table,
                Item=item,
                ConditionExpression="attribute_not_exists(#seq)",
                ExpressionAttributeNames={"#seq": t.SEQ_NO},
            )
        except ClientError as error:
            if error.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True


def max_seq(dynamodb: Any, table: str, dataset_id: str) -> int:
    """The highest WAL seq of the dataset (0 when it has none): the producer's counter."""
    page = dynamodb.query(
        TableName=table,
        KeyConditionExpression="#ds = :ds AND #seq >= :one",
        ExpressionAttributeNames={"#ds": t.DATASET_ID, "#seq": t.SEQ_NO},
        ExpressionAttributeValues={":ds": {"S": dataset_id}, ":one": {"N": "1"}},
        ProjectionExpression="#seq",
        ScanIndexForward=False,
        ConsistentRead=True,
        Limit=1,
    )
    items = page.get("Items", [])
    return int(items[0][t.SEQ_NO]["N"]) if items else 0


class _Row:
    __slots__ = ("dataset_id", "payload", "checksum", "created_at", "client_token")

    def __init__(self, dataset_id: str, payload: str, checksum: str, created_at: int, client_token: str | None):
        self.dataset_id = dataset_id
        self.payload = payload
        self.checksum = checksum
        self.created_at = created_at
        self.client_token = client_token


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
