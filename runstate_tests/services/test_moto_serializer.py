"""Our moto server writes a DynamoDB AttributeValue through the members it has, instead of moto's walk over
all ten (runstate.services.moto_server.serialize_attribute_values_directly): the answers are the same,
and every attribute type comes back as it was written."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.core.serialize import BaseJSONSerializer

from runstate.services.moto_server import SerializedMotoServer

ITEM = {
    "pk": {"S": "row-1"},
    "text": {"S": 'ünïcode, "quotes" and \\ slashes'},
    "empty": {"S": ""},
    "number": {"N": "-12.5e3"},
    "blob": {"B": b"\x00\xffbytes"},
    "strings": {"SS": ["a", "b"]},
    "numbers": {"NS": ["1", "2.5"]},
    "blobs": {"BS": [b"\x01", b"\x02"]},
    "null": {"NULL": True},
    "flag": {"BOOL": False},
    "list": {"L": [{"S": "x"}, {"N": "1"}, {"L": []}, {"M": {}}]},
    "map": {"M": {"inner": {"M": {"deep": {"BOOL": True}, "none": {"NULL": True}}}, "blob": {"B": b"z"}}},
}


@pytest.fixture
def moto_url() -> Iterator[str]:
    server = SerializedMotoServer()
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def _client(service: str, url: str) -> Any:
    return boto3.client(service, endpoint_url=url, region_name="us-east-1")


def _raw_bodies(client: Any) -> list[dict[str, Any]]:
    """Every answer body the client reads from now on, as JSON."""
    bodies: list[dict[str, Any]] = []
    client.meta.events.register(
        "after-call", lambda http_response, **_: bodies.append(json.loads(http_response.content))
    )
    return bodies


@pytest.fixture
def table_with_history(moto_url: str) -> Iterator[tuple[Any, Any, str]]:
    """A table with a stream of new and old images, holding ITEM written and then changed once. Dropped
    after the test: moto's tables are module globals, which the deployment tests' gated moto may share."""
    dynamodb, streams = _client("dynamodb", moto_url), _client("dynamodbstreams", moto_url)
    name = f"t{uuid.uuid4().hex[:8]}"
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )
    dynamodb.put_item(TableName=name, Item=ITEM)
    dynamodb.put_item(TableName=name, Item={**ITEM, "number": {"N": "7"}})
    yield dynamodb, streams, name
    dynamodb.delete_table(TableName=name)


def _stream_page(streams: Any, table_arn: str) -> dict[str, Any]:
    stream_arn = streams.list_streams(TableName=table_arn.rsplit("/", 1)[-1])["Streams"][0]["StreamArn"]
    shard = streams.describe_stream(StreamArn=stream_arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = streams.get_shard_iterator(
        StreamArn=stream_arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )
    return streams.get_records(ShardIterator=iterator["ShardIterator"])


def test_stream_pages_and_queries_are_written_as_motos_walk_writes_them(table_with_history, monkeypatch):
    dynamodb, streams, name = table_with_history
    table_arn = dynamodb.describe_table(TableName=name)["Table"]["TableArn"]
    stream_bodies, table_bodies = _raw_bodies(streams), _raw_bodies(dynamodb)

    def read() -> None:
        _stream_page(streams, table_arn)
        dynamodb.query(
            TableName=name, KeyConditionExpression="pk = :k", ExpressionAttributeValues={":k": {"S": "row-1"}}
        )
        dynamodb.get_item(TableName=name, Key={"pk": {"S": "row-1"}})

    read()
    direct = stream_bodies[-1], table_bodies[-2:]
    walk = BaseJSONSerializer._serialize_type_structure.moto_walk
    monkeypatch.setattr(BaseJSONSerializer, "_serialize_type_structure", walk)
    read()
    walked = stream_bodies[-1], table_bodies[-2:]

    for body in (direct[0], walked[0]):  # each GetRecords answer names a new iterator of its own
        assert body.pop("NextShardIterator")
    assert len(direct[0]["Records"]) == 2
    assert direct == walked


def test_every_attribute_type_comes_back_from_the_stream_and_the_table_as_written(table_with_history):
    dynamodb, streams, name = table_with_history
    table_arn = dynamodb.describe_table(TableName=name)["Table"]["TableArn"]

    inserted, modified = _stream_page(streams, table_arn)["Records"]

    assert inserted["dynamodb"]["NewImage"] == ITEM
    assert modified["dynamodb"]["OldImage"] == ITEM
    assert modified["dynamodb"]["NewImage"] == {**ITEM, "number": {"N": "7"}}
    assert dynamodb.get_item(TableName=name, Key={"pk": {"S": "row-1"}})["Item"]["map"] == ITEM["map"]
