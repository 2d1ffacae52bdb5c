"""`WalTable`: the one owner of the WAL's DynamoDB table. Every read and write of it goes through here.

The item layout, the attribute names and the table's creation live in `layout.py`. This class adds
the requests: single-item conditional writes for the append path, consistent reads for the flush,
the Pending index for the sweep and status, and the Kind index for the list of datasets. boto3's
paginators do the paging. A driver error (botocore's ClientError or BotoCoreError) leaves this
class as a `WalServiceError` that names the table and the endpoint; a failed condition is an
answer (False or None), never an error.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from runstate.wal import layout as t
from runstate.wal.errors import WalContentionError, WalServiceError

MAX_SEQ = 2**63 - 1  # DynamoDB numbers hold it; the open end of a seq range
BATCH_GET_LIMIT = 100  # DynamoDB's limit of keys per BatchGetItem
CONDITION_FAILED = "ConditionalCheckFailedException"


@dataclass(frozen=True)
class DatasetMeta:
    """The dataset's meta row: LastSeq (the producer's seq hint, may lag) and LastAppliedSeq."""

    last_seq: int = 0
    last_applied_seq: int = 0


@dataclass(frozen=True)
class PendingRow:
    """One entry of the Pending index: a WAL row not yet applied, and when it was appended."""

    dataset_id: str
    seq: int
    created_at: int


def _key(dataset_id: str, seq: int) -> dict[str, Any]:
    return {t.DATASET_ID: {"S": dataset_id}, t.SEQ_NO: {"N": str(seq)}}


def _seq(item: dict[str, Any]) -> int:
    return int(item[t.SEQ_NO]["N"])


class WalTable:
    """The WAL table `name` through a boto3 DynamoDB client (thread-safe, as boto3 clients are)."""

    def __init__(self, client: Any, name: str) -> None:
        self.client = client
        self.name = name

    # --- requests and their errors ------------------------------------------------------------------

    def _service_error(self, error: Exception) -> WalServiceError:
        where = getattr(self.client.meta, "endpoint_url", None) or "AWS"
        code = error.response["Error"]["Code"] if isinstance(error, ClientError) else type(error).__name__
        if code == "ResourceNotFoundException":
            return WalServiceError(
                f"WAL table {self.name!r} not found at {where}; run `runstate services up` or `runstate db upgrade`"
            )
        return WalServiceError(f"WAL table {self.name!r} at {where}: {code}: {error}")

    def _call(self, operation: str, *, conditional: bool = False, **request: Any) -> dict[str, Any] | None:
        """One request; None when `conditional` and its condition failed."""
        try:
            return getattr(self.client, operation)(TableName=self.name, **request)
        except ClientError as error:
            if conditional and error.response["Error"]["Code"] == CONDITION_FAILED:
                return None
            raise self._service_error(error) from error
        except BotoCoreError as error:
            raise self._service_error(error) from error

    def _query(self, **request: Any) -> Iterator[dict[str, Any]]:
        """Every item of a Query, page after page (boto3's paginator)."""
        try:
            for page in self.client.get_paginator("query").paginate(TableName=self.name, **request):
                yield from page.get("Items", [])
        except (ClientError, BotoCoreError) as error:
            raise self._service_error(error) from error

    # --- rows -----------------------------------------------------------------------------------------

    def put_new(self, item: dict[str, Any]) -> bool:
        """Put `item` only if its key is free; False when it is taken (the claim of a seq or a token)."""
        response = self._call(
            "put_item",
            conditional=True,
            Item=item,
            ConditionExpression="attribute_not_exists(#seq)",
            ExpressionAttributeNames={"#seq": t.SEQ_NO},
        )
        return response is not None

    def get_item(self, dataset_id: str, seq: int) -> dict[str, Any] | None:
        return self._call("get_item", Key=_key(dataset_id, seq), ConsistentRead=True).get("Item")

    def get_rows(
        self, dataset_id: str, seqs: Iterable[int], projection: str | None = None
    ) -> list[dict[str, Any]]:
        """The existing rows among `seqs`, by consistent BatchGetItem (O(rows) whatever the partition size)."""
        wanted = list(seqs)
        found: list[dict[str, Any]] = []
        for start in range(0, len(wanted), BATCH_GET_LIMIT):
            keys = [_key(dataset_id, seq) for seq in wanted[start : start + BATCH_GET_LIMIT]]
            found.extend(self._batch_get(dataset_id, keys, projection))
        return sorted(found, key=_seq)

    def _batch_get(self, dataset_id: str, keys: list[dict], projection: str | None) -> list[dict[str, Any]]:
        request: dict[str, Any] = {"Keys": keys, "ConsistentRead": True}
        if projection:
            names = {f"#p{i}": name for i, name in enumerate({projection, t.SEQ_NO})}
            request.update(ProjectionExpression=", ".join(names), ExpressionAttributeNames=names)
        pending, found = {self.name: request}, []
        for attempt in range(50):
            try:
                response = self.client.batch_get_item(RequestItems=pending)
            except (ClientError, BotoCoreError) as error:
                raise self._service_error(error) from error
            found.extend(response.get("Responses", {}).get(self.name, []))
            pending = response.get("UnprocessedKeys") or {}
            if not pending:
                return found
            time.sleep(min(0.5, 0.01 * 2**attempt) * random.random())
        raise WalContentionError(f"dataset {dataset_id!r}: BatchGetItem kept returning unprocessed keys")

    def query_rows(
        self, dataset_id: str, first_seq: int = 1, last_seq: int = MAX_SEQ
    ) -> list[dict[str, Any]]:
        """The rows with first_seq <= SeqNo <= last_seq (seq 0 is the meta row), consistent, seq order."""
        return list(
            self._query(
                KeyConditionExpression="#ds = :ds AND #seq BETWEEN :first AND :last",
                ExpressionAttributeNames={"#ds": t.DATASET_ID, "#seq": t.SEQ_NO},
                ExpressionAttributeValues={
                    ":ds": {"S": dataset_id},
                    ":first": {"N": str(first_seq)},
                    ":last": {"N": str(last_seq)},
                },
                ConsistentRead=True,
            )
        )

    def lowest_seq(self, dataset_id: str) -> int | None:
        """The lowest WAL row still in the table (rows below it were trimmed), None when there is none."""
        response = self._call(
            "query",
            KeyConditionExpression="#ds = :ds AND #seq >= :one",
            ExpressionAttributeNames={"#ds": t.DATASET_ID, "#seq": t.SEQ_NO},
            ExpressionAttributeValues={":ds": {"S": dataset_id}, ":one": {"N": "1"}},
            ConsistentRead=True,
            Limit=1,
            ProjectionExpression="#seq",
        )
        items = response.get("Items", [])
        return _seq(items[0]) if items else None

    def mark_applied(self, dataset_id: str, seq: int, status: str, blob_key: str, applied_at: int) -> bool:
        """Pending -> Applied#YYYY-MM; False when the row is not Pending (already applied, or trimmed)."""
        response = self._call(
            "update_item",
            conditional=True,
            Key=_key(dataset_id, seq),
            UpdateExpression="SET #status = :applied, #blob = :blob, #at = :at",
            ConditionExpression="#status = :pending",
            ExpressionAttributeNames={"#status": t.STATUS_IDX, "#blob": t.BLOB_KEY, "#at": t.APPLIED_AT},
            ExpressionAttributeValues={
                ":applied": {"S": status},
                ":pending": {"S": t.PENDING},
                ":blob": {"S": blob_key},
                ":at": {"N": str(applied_at)},
            },
        )
        return response is not None

    def applied_seqs(self, dataset_id: str, up_to_seq: int, created_before: int) -> list[int]:
        """Seqs of Applied rows with seq <= up_to_seq created before the cutoff (epoch seconds)."""
        items = self._query(
            KeyConditionExpression="#ds = :ds AND #seq BETWEEN :one AND :upto",
            FilterExpression="begins_with(#status, :applied) AND #created < :cutoff",
            ExpressionAttributeNames={
                "#ds": t.DATASET_ID,
                "#seq": t.SEQ_NO,
                "#status": t.STATUS_IDX,
                "#created": t.CREATED_AT,
            },
            ExpressionAttributeValues={
                ":ds": {"S": dataset_id},
                ":one": {"N": "1"},
                ":upto": {"N": str(up_to_seq)},
                ":applied": {"S": t.APPLIED_PREFIX},
                ":cutoff": {"N": str(created_before)},
            },
            ProjectionExpression="#seq",
        )
        return [_seq(item) for item in items]

    def delete_applied(self, dataset_id: str, seq: int) -> bool:
        """Delete an Applied row; never a Pending one, whatever happened since it was listed."""
        response = self._call(
            "delete_item",
            conditional=True,
            Key=_key(dataset_id, seq),
            ConditionExpression="begins_with(#status, :applied)",
            ExpressionAttributeNames={"#status": t.STATUS_IDX},
            ExpressionAttributeValues={":applied": {"S": t.APPLIED_PREFIX}},
        )
        return response is not None

    # --- the Pending index ---------------------------------------------------------------------------

    def _pending_query(self, **extra: Any) -> dict[str, Any]:
        return {
            "IndexName": t.STATUS_INDEX,
            "KeyConditionExpression": "#status = :pending",
            "ExpressionAttributeNames": {"#status": t.STATUS_IDX},
            "ExpressionAttributeValues": {":pending": {"S": t.PENDING}},
            "ScanIndexForward": True,
            **extra,
        }

    def pending(self, limit: int = 10_000) -> list[PendingRow]:
        """Up to `limit` Pending rows, oldest first (the index is eventually consistent on DynamoDB)."""
        rows: list[PendingRow] = []
        for item in self._query(
            **self._pending_query(PaginationConfig={"MaxItems": limit, "PageSize": 1000})
        ):
            rows.append(PendingRow(item[t.DATASET_ID]["S"], _seq(item), int(item[t.CREATED_AT]["N"])))
        return rows

    def oldest_pending(self) -> PendingRow | None:
        items = self._call("query", **self._pending_query(Limit=1)).get("Items", [])
        if not items:
            return None
        item = items[0]
        return PendingRow(item[t.DATASET_ID]["S"], _seq(item), int(item[t.CREATED_AT]["N"]))

    # --- the meta row ----------------------------------------------------------------------------------

    def meta(self, dataset_id: str) -> DatasetMeta:
        item = self.get_item(dataset_id, t.META_SEQ)
        return _meta(item) if item else DatasetMeta()

    def metas(self) -> dict[str, DatasetMeta]:
        """Every dataset's meta row, from the sparse Kind index (no table scan)."""
        items = self._query(
            IndexName=t.KIND_INDEX,
            KeyConditionExpression="#kind = :kind",
            ExpressionAttributeNames={"#kind": t.KIND},
            ExpressionAttributeValues={":kind": {"S": t.META_KIND}},
        )
        return {item[t.DATASET_ID]["S"]: _meta(item) for item in items}

    def max_seq(self, dataset_id: str) -> int:
        """The dataset's last seq (0 when none): the hint, then single-item probes past a lagging hint."""
        seq = self.meta(dataset_id).last_seq
        while self.get_rows(dataset_id, [seq + 1], t.SEQ_NO):
            seq += 1
        return seq

    def advance_seq_hint(self, dataset_id: str, seq: int) -> bool:
        """LastSeq := seq (monotonic); also creates the meta row that lists the dataset."""
        return self._raise_meta(dataset_id, t.LAST_SEQ, seq, also_applied_zero=True)

    def advance_last_applied(self, dataset_id: str, seq: int) -> bool:
        """LastAppliedSeq := seq unless it is already >= seq (monotonic). True when it moved."""
        return seq >= 1 and self._raise_meta(dataset_id, t.LAST_APPLIED_SEQ, seq)

    def _raise_meta(self, dataset_id: str, attribute: str, seq: int, also_applied_zero: bool = False) -> bool:
        """meta.attribute := seq only if that raises it; False when it is already >= seq."""
        update = "SET #value = :seq, #kind = :kind"
        names = {"#value": attribute, "#kind": t.KIND}
        values = {":seq": {"N": str(seq)}, ":kind": {"S": t.META_KIND}}
        if also_applied_zero:  # a new meta row starts with nothing applied
            update += ", #applied = if_not_exists(#applied, :zero)"
            names["#applied"] = t.LAST_APPLIED_SEQ
            values[":zero"] = {"N": "0"}
        response = self._call(
            "update_item",
            conditional=True,
            Key=_key(dataset_id, t.META_SEQ),
            UpdateExpression=update,
            ConditionExpression="attribute_not_exists(#value) OR #value < :seq",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )
        return response is not None

    # --- client-token rows -------------------------------------------------------------------------------

    def token_item(self, dataset_id: str, client_token: str) -> dict[str, Any] | None:
        return self.get_item(t.token_item_id(dataset_id, client_token), 0)

    def token_key(self, dataset_id: str, client_token: str) -> dict[str, Any]:
        return _key(t.token_item_id(dataset_id, client_token), 0)

    def record_token_seq(self, dataset_id: str, client_token: str, seq: int) -> bool:
        """AssignedSeq := seq unless another seq is already recorded (False then)."""
        response = self._call(
            "update_item",
            conditional=True,
            Key=self.token_key(dataset_id, client_token),
            UpdateExpression="SET #assigned = :seq",
            ConditionExpression="attribute_not_exists(#assigned) OR #assigned = :seq",
            ExpressionAttributeNames={"#assigned": t.ASSIGNED_SEQ},
            ExpressionAttributeValues={":seq": {"N": str(seq)}},
        )
        return response is not None

    # --- control items (shard leases): a version compare-and-set, the lease's fence --------------------

    def control_item(self, item_id: str) -> dict[str, Any] | None:
        return self.get_item(item_id, 0)

    def put_control(self, item_id: str, attributes: dict[str, Any], version: int) -> bool:
        """Write the control item as Version `version` + 1 only if it is still at `version` (0: absent);
        False when another writer moved it first."""
        item = {**_key(item_id, 0), **attributes, t.VERSION: {"N": str(version + 1)}}
        condition = "attribute_not_exists(#version)" if version == 0 else "#version = :version"
        values = {":version": {"N": str(version)}} if version else None
        request: dict[str, Any] = {"ExpressionAttributeNames": {"#version": t.VERSION}}
        if values:
            request["ExpressionAttributeValues"] = values
        response = self._call(
            "put_item", conditional=True, Item=item, ConditionExpression=condition, **request
        )
        return response is not None

    # --- the table itself ----------------------------------------------------------------------------------

    def stream_arn(self) -> str | None:
        return self._call("describe_table")["Table"].get("LatestStreamArn")

    def ensure(self) -> None:
        """Create the table if missing (idempotent)."""
        t.ensure_wal_table(self.client, self.name)


def _meta(item: dict[str, Any]) -> DatasetMeta:
    return DatasetMeta(
        last_seq=int(item.get(t.LAST_SEQ, {"N": "0"})["N"]),
        last_applied_seq=int(item.get(t.LAST_APPLIED_SEQ, {"N": "0"})["N"]),
    )
