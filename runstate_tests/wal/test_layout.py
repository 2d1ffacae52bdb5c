"""ensure_wal_table / ensure_blob_bucket: idempotent, and loud about a foreign table of the same name."""

from __future__ import annotations

import uuid

import pytest

from runstate.wal import ensure_blob_bucket, ensure_wal_table
from runstate.wal.layout import KIND_INDEX, STATUS_INDEX, table_spec


def test_ensure_is_idempotent_and_creates_stream_and_indexes(wal):
    ensure_wal_table(wal.dynamodb, wal.table)
    ensure_blob_bucket(wal.s3, wal.bucket)

    table = wal.dynamodb.describe_table(TableName=wal.table)["Table"]
    assert table["StreamSpecification"] == {"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"}
    assert {i["IndexName"] for i in table["GlobalSecondaryIndexes"]} == {STATUS_INDEX, KIND_INDEX}
    assert table["LatestStreamArn"]


def test_a_table_without_its_stream_gets_one(dynamodb):
    name = f"wal_{uuid.uuid4().hex[:10]}"
    spec = table_spec(name)
    del spec["StreamSpecification"]
    dynamodb.create_table(**spec)

    ensure_wal_table(dynamodb, name)

    assert dynamodb.describe_table(TableName=name)["Table"]["StreamSpecification"]["StreamEnabled"] is True
    dynamodb.delete_table(TableName=name)


def test_a_foreign_table_of_the_same_name_is_refused(dynamodb):
    name = f"wal_{uuid.uuid4().hex[:10]}"
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )

    with pytest.raises(ValueError, match=f"table '{name}' exists with key schema"):
        ensure_wal_table(dynamodb, name)
    dynamodb.delete_table(TableName=name)
