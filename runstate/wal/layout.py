"""The WAL table and the blob bucket: names of keys, attributes and indexes, and idempotent creation.

One DynamoDB table holds three kinds of item, all keyed (DatasetId S, SeqNo N):
- WAL rows: (dataset, seq >= 1) with StatusIdx, Type, Checksum, CreatedAt, Payload, ClientToken (if any),
  and BlobKey + AppliedAt once applied;
- the dataset meta row: (dataset, 0) with LastSeq (seq hint), LastAppliedSeq and Kind="DatasetMeta";
- client-token rows: ("#token#<dataset>#<token>", 0) with Checksum, Floor and, once written, AssignedSeq;
- control items: ("#lease#...", 0) with Version and the lease's attributes (`lease.py`).
Dataset ids never start with '#', so token rows and control items cannot collide with datasets. Producer rows have
Type DELTA; SNAPSHOT blobs are written by compaction and referenced from the manifest only. BlobKey is
the blob that holds the row (set when the row is applied: its key is only known once it is batched).
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

DATASET_ID = "DatasetId"
SEQ_NO = "SeqNo"
STATUS_IDX = "StatusIdx"
CREATED_AT = "CreatedAt"
BLOB_KEY = "BlobKey"
TYPE = "Type"
CHECKSUM = "Checksum"
PAYLOAD = "Payload"
APPLIED_AT = "AppliedAt"
KIND = "Kind"
LAST_APPLIED_SEQ = "LastAppliedSeq"
ASSIGNED_SEQ = "AssignedSeq"
LAST_SEQ = "LastSeq"
CLIENT_TOKEN = "ClientToken"

PENDING = "Pending"
APPLIED_PREFIX = "Applied#"
META_SEQ = 0
META_KIND = "DatasetMeta"
TOKEN_PREFIX = "#token#"
LEASE_PREFIX = "#lease#"
VERSION = "Version"

# GSI over every WAL row: StatusIdx = "Pending" | "Applied#YYYY-MM", sorted by CreatedAt (oldest first).
STATUS_INDEX = "StatusIdx-CreatedAt"
# Sparse GSI over the meta rows only: lists every dataset without a table scan.
KIND_INDEX = "Kind-DatasetId"


def applied_status(year: int, month: int) -> str:
    return f"{APPLIED_PREFIX}{year:04d}-{month:02d}"


def token_item_id(dataset_id: str, client_token: str) -> str:
    return f"{TOKEN_PREFIX}{dataset_id}#{client_token}"


def lease_item_id(name: str) -> str:
    return f"{LEASE_PREFIX}{name}"


def table_spec(table: str) -> dict[str, Any]:
    """CreateTable arguments for the WAL table (on-demand billing, NEW_IMAGE stream, two GSIs)."""
    return {
        "TableName": table,
        "KeySchema": [
            {"AttributeName": DATASET_ID, "KeyType": "HASH"},
            {"AttributeName": SEQ_NO, "KeyType": "RANGE"},
        ],
        "AttributeDefinitions": [
            {"AttributeName": DATASET_ID, "AttributeType": "S"},
            {"AttributeName": SEQ_NO, "AttributeType": "N"},
            {"AttributeName": STATUS_IDX, "AttributeType": "S"},
            {"AttributeName": CREATED_AT, "AttributeType": "N"},
            {"AttributeName": KIND, "AttributeType": "S"},
        ],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": STATUS_INDEX,
                "KeySchema": [
                    {"AttributeName": STATUS_IDX, "KeyType": "HASH"},
                    {"AttributeName": CREATED_AT, "KeyType": "RANGE"},
                ],
                # Keys only: the sweep and the status need (dataset, seq, status, created) and nothing more.
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
            {
                "IndexName": KIND_INDEX,
                "KeySchema": [
                    {"AttributeName": KIND, "KeyType": "HASH"},
                    {"AttributeName": DATASET_ID, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            },
        ],
        "BillingMode": "PAY_PER_REQUEST",
        "StreamSpecification": {"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"},
    }


def ensure_wal_table(dynamodb: Any, table: str) -> None:
    """Create the WAL table if missing, wait until it is active, and make sure its stream is on. Idempotent."""
    try:
        dynamodb.create_table(**table_spec(table))
    except ClientError as error:
        if error.response["Error"]["Code"] != "ResourceInUseException":
            raise
    dynamodb.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    description = dynamodb.describe_table(TableName=table)["Table"]
    _check_existing_table(table, description)
    stream = description.get("StreamSpecification") or {}
    if not stream.get("StreamEnabled"):
        dynamodb.update_table(
            TableName=table, StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"}
        )


def _check_existing_table(table: str, description: dict[str, Any]) -> None:
    """A table of the same name made for something else must fail loudly, not be written into."""
    keys = {k["AttributeName"]: k["KeyType"] for k in description["KeySchema"]}
    if keys != {DATASET_ID: "HASH", SEQ_NO: "RANGE"}:
        raise ValueError(f"table {table!r} exists with key schema {keys}, not ({DATASET_ID}, {SEQ_NO})")
    indexes = {i["IndexName"] for i in description.get("GlobalSecondaryIndexes", [])}
    missing = {STATUS_INDEX, KIND_INDEX} - indexes
    if missing:
        raise ValueError(f"table {table!r} exists without the WAL indexes {sorted(missing)}")


# S3's own rule, not runstate's default region (runstate.defaults.AWS_REGION): a bucket in us-east-1 is
# created without a LocationConstraint, one anywhere else must name its region.
S3_HOME_REGION = "us-east-1"


def ensure_blob_bucket(s3: Any, bucket: str) -> None:
    """Create the blob bucket if missing. Idempotent."""
    region = s3.meta.region_name
    args: dict[str, Any] = {"Bucket": bucket}
    if region and region != S3_HOME_REGION:
        args["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        s3.create_bucket(**args)
    except ClientError as error:
        if error.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
    s3.head_bucket(Bucket=bucket)
