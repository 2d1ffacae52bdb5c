"""The producer: appends a list of changes to a dataset's WAL as one row with the next SeqNo.

SeqNo assignment is a conditional PutItem of row (dataset, seq) with attribute_not_exists: the row itself
is the claim, so two writers can never share a seq, and a crash can never leave a reserved-but-unwritten
seq behind (which a separate counter incremented first would). The candidate seq is the meta row's
LastSeq + 1; LastSeq is advanced (monotonic) after each successful put, so it may lag after a crash, in
which case the conditional put fails and the writer moves up one slot at a time. A slot is only tried
once every lower slot is taken, so seqs are gapless. Compaction trims only rows <= LastSeq, so no
writer ever probes a trimmed slot.

Why not TransactWriteItems (counter + row + token in one transaction)? It would work on DynamoDB, but
moto deep-copies the whole table for every item of every transaction, so appends slow down with table
size (28 ms -> 90 ms per append at a few hundred rows). Nor a Query for the max seq: moto sorts the
whole table on every Query. Every request on the append path is a single-item one (GetItem, PutItem,
UpdateItem, BatchGetItem), O(1) on moto as on DynamoDB.

Client tokens (a retried append never creates two rows): the token row ("#token#<dataset>#<token>", 0)
is claimed first with a conditional put that records the payload checksum and the highest seq at claim
time (Floor). Any writer completing that token (the first one, or a retry after a crash) scans the rows
above the last seq it has checked for a row carrying the token before each attempt, so once a row
with the token exists, no second one is written. The token row finally records AssignedSeq.
"""

from __future__ import annotations

import logging
import random
import time
from datetime import datetime, timezone
from typing import Any, Iterable, Sequence

from botocore.exceptions import BotoCoreError, ClientError

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
log = logging.getLogger(__name__)
MAX_SEQ = 2**63 - 1  # DynamoDB numbers hold it; the open end of a seq range


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
        floor = self._seq_hint(dataset_id)
        if self._claim_token(row, floor):
            return self._write_row(row, checked_upto=floor, hint=floor)
        token = self._token_item(dataset_id, client_token, checksum)
        if token is None:  # the claim failed because the row exists, and token rows are never deleted
            raise WalIntegrityError(f"dataset {dataset_id!r}: client token {client_token!r} vanished while claimed")
        if t.ASSIGNED_SEQ in token:
            return int(token[t.ASSIGNED_SEQ]["N"])
        # Claimed but not finished (a crash, or a concurrent retry): finish it, scanning from the claim's floor.
        return self._write_row(row, checked_upto=int(token["Floor"]["N"]))

    # --- seq assignment ----------------------------------------------------------------------------------

    def _write_row(self, row: "_Row", checked_upto: int | None, hint: int | None = None) -> int:
        """Put the row at the first free seq (conditional put = probe + claim); with a token, stop as soon as
        a row carrying it is found below the seq about to be tried."""
        candidate = (self._seq_hint(row.dataset_id) if hint is None else hint) + 1
        for attempt in range(MAX_ATTEMPTS):
            if row.client_token is not None and checked_upto is not None and candidate - 1 > checked_upto:
                existing = self._seq_with_token(row, checked_upto + 1, candidate - 1)
                if existing is not None:
                    return self._record_token_seq(row, existing)
                checked_upto = candidate - 1
            if self._put_row(row, candidate):
                self._advance_hint(row.dataset_id, candidate)
                return self._record_token_seq(row, candidate) if row.client_token is not None else candidate
            # Taken: by a concurrent writer (the hint has moved) or by one that died before moving it.
            if attempt >= 2:
                time.sleep(min(0.05, 0.001 * (2 ** min(attempt, 6))) * random.random())
            candidate = max(candidate + 1, self._seq_hint(row.dataset_id) + 1)
        raise WalContentionError(
            f"dataset {row.dataset_id!r}: gave up appending after {MAX_ATTEMPTS} attempts under write contention"
        )

    def _seq_hint(self, dataset_id: str) -> int:
        return seq_hint(self.dynamodb, self.table, dataset_id)

    def _advance_hint(self, dataset_id: str, seq: int) -> None:
        """LastSeq := seq (monotonic). Also creates the meta row that lists the dataset."""
        try:
            self.dynamodb.update_item(
                TableName=self.table,
                Key={t.DATASET_ID: {"S": dataset_id}, t.SEQ_NO: {"N": str(t.META_SEQ)}},
                UpdateExpression="SET #last = :seq, #kind = :kind, #applied = if_not_exists(#applied, :zero)",
                ConditionExpression="attribute_not_exists(#last) OR #last < :seq",
                ExpressionAttributeNames={"#last": t.LAST_SEQ, "#kind": t.KIND, "#applied": t.LAST_APPLIED_SEQ},
                ExpressionAttributeValues={
                    ":seq": {"N": str(seq)}, ":kind": {"S": t.META_KIND}, ":zero": {"N": "0"},
                },
            )
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                log.warning("dataset %r: seq hint not advanced to %d (%s); the next writer probes past it", dataset_id, seq, error)
        except BotoCoreError as error:
            # The row is durably written: failing the append now would invite a duplicate retry.
            log.warning("dataset %r: seq hint not advanced to %d (%s); the next writer probes past it", dataset_id, seq, error)

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
        """The seq in first..last whose row carries this append's client token, if any (consistent reads)."""
        items = get_rows(self.dynamodb, self.table, row.dataset_id, range(first, last + 1), t.CLIENT_TOKEN)
        for item in items:
            if item.get(t.CLIENT_TOKEN, {}).get("S") == row.client_token:
                return int(item[t.SEQ_NO]["N"])
        return None

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


def seq_hint(dynamodb: Any, table: str, dataset_id: str) -> int:
    """The meta row's LastSeq: every seq up to it exists (or was trimmed); it may lag the true last seq."""
    item = dynamodb.get_item(
        TableName=table,
        Key={t.DATASET_ID: {"S": dataset_id}, t.SEQ_NO: {"N": str(t.META_SEQ)}},
        ConsistentRead=True,
        ProjectionExpression=t.LAST_SEQ,
    ).get("Item")
    return int(item[t.LAST_SEQ]["N"]) if item and t.LAST_SEQ in item else 0


def max_seq(dynamodb: Any, table: str, dataset_id: str) -> int:
    """The dataset's last seq (0 when none): the hint, then single-item probes past a lagging hint."""
    seq = seq_hint(dynamodb, table, dataset_id)
    while get_rows(dynamodb, table, dataset_id, [seq + 1], t.SEQ_NO):
        seq += 1
    return seq


def get_rows(
    dynamodb: Any, table: str, dataset_id: str, seqs: Iterable[int], projection: str | None = None
) -> list[dict[str, Any]]:
    """The existing rows among `seqs`, by consistent BatchGetItem (O(rows), unlike a Query on moto)."""
    wanted = list(seqs)
    found: list[dict[str, Any]] = []
    for start in range(0, len(wanted), 100):
        keys = [{t.DATASET_ID: {"S": dataset_id}, t.SEQ_NO: {"N": str(seq)}} for seq in wanted[start : start + 100]]
        request: dict[str, Any] = {"Keys": keys, "ConsistentRead": True}
        if projection:
            names = {f"#p{i}": name for i, name in enumerate({projection, t.SEQ_NO})}
            request.update(ProjectionExpression=", ".join(names), ExpressionAttributeNames=names)
        pending = {table: request}
        for attempt in range(50):
            response = dynamodb.batch_get_item(RequestItems=pending)
            found.extend(response.get("Responses", {}).get(table, []))
            pending = response.get("UnprocessedKeys") or {}
            if not pending:
                break
            time.sleep(min(0.5, 0.01 * 2**attempt) * random.random())
        else:
            raise WalContentionError(f"dataset {dataset_id!r}: BatchGetItem kept returning unprocessed keys")
    return sorted(found, key=lambda item: int(item[t.SEQ_NO]["N"]))


def query_rows(
    dynamodb: Any, table: str, dataset_id: str, first_seq: int = 1, last_seq: int = MAX_SEQ
) -> list[dict[str, Any]]:
    """The rows with first_seq <= SeqNo <= last_seq (seq 0 is the meta row), consistent Query, seq order."""
    request: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "#ds = :ds AND #seq BETWEEN :first AND :last",
        "ExpressionAttributeNames": {"#ds": t.DATASET_ID, "#seq": t.SEQ_NO},
        "ExpressionAttributeValues": {
            ":ds": {"S": dataset_id}, ":first": {"N": str(first_seq)}, ":last": {"N": str(last_seq)},
        },
        "ConsistentRead": True,
    }
    items: list[dict[str, Any]] = []
    while True:
        page = dynamodb.query(**request)
        items.extend(page.get("Items", []))
        if "LastEvaluatedKey" not in page:
            return items
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]


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
