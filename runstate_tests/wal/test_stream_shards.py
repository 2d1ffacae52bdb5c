"""Shard lifecycle in read_stream: split shards, closed parents, trimmed and expired positions.

moto's stream has exactly one shard that never closes or trims, so these cases run against a small
in-memory stand-in of the DynamoDB Streams API (the only fake in the WAL suite, for what moto cannot do).
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from runstate.wal import WalKey, WalTable, read_stream

ARN = "arn:aws:dynamodb:us-east-1:1:table/wal/stream/1"


def _record(seq: int, dataset_id: str, wal_seq: int, status: str = "Pending") -> dict[str, Any]:
    image = {"DatasetId": {"S": dataset_id}, "SeqNo": {"N": str(wal_seq)}, "StatusIdx": {"S": status}}
    return {"eventName": "INSERT", "dynamodb": {"SequenceNumber": str(seq), "NewImage": image}}


class FakeStreams:
    def __init__(self, shards: dict[str, dict[str, Any]]) -> None:
        self.shards = (
            shards  # id -> {"parent": id|None, "records": [...], "closed": bool, "trimmed_below": int}
        )
        self.fail_next_get_records: str | None = None

    def describe_stream(self, StreamArn: str, **_: Any) -> dict[str, Any]:
        shards = [
            {"ShardId": sid, **({"ParentShardId": s["parent"]} if s["parent"] else {})}
            for sid, s in self.shards.items()
        ]
        return {"StreamDescription": {"Shards": shards}}

    def get_shard_iterator(
        self, StreamArn: str, ShardId: str, ShardIteratorType: str, SequenceNumber: str = ""
    ) -> dict:
        shard = self.shards[ShardId]
        if ShardIteratorType == "TRIM_HORIZON":
            start = 0
        else:
            after = int(SequenceNumber)
            if after < shard.get("trimmed_below", 0):
                raise ClientError(
                    {"Error": {"Code": "TrimmedDataAccessException", "Message": "trimmed"}},
                    "GetShardIterator",
                )
            start = next(
                (i for i, r in enumerate(shard["records"]) if int(r["dynamodb"]["SequenceNumber"]) > after),
                len(shard["records"]),
            )
        return {"ShardIterator": f"{ShardId}|{start}"}

    def get_records(self, ShardIterator: str, Limit: int) -> dict:
        if self.fail_next_get_records:
            code, self.fail_next_get_records = self.fail_next_get_records, None
            raise ClientError({"Error": {"Code": code, "Message": "x"}}, "GetRecords")
        shard_id, start = ShardIterator.split("|")
        shard = self.shards[shard_id]
        if shard.get("leading_empty_pages", 0) > 0:
            shard["leading_empty_pages"] -= 1
            return {"Records": [], "NextShardIterator": ShardIterator}
        page = shard["records"][int(start) : int(start) + Limit]
        nxt = int(start) + len(page)
        done = shard["closed"] and nxt >= len(shard["records"])
        return {"Records": page, **({} if done else {"NextShardIterator": f"{shard_id}|{nxt}"})}


class FakeTable:
    def describe_table(self, TableName: str) -> dict:
        return {"Table": {"LatestStreamArn": ARN}}


def test_a_closed_parent_is_read_to_its_end_then_its_children_and_marked_done():
    streams = FakeStreams(
        {
            "child-b": {"parent": "parent", "records": [_record(30, "b", 1)], "closed": False},
            "parent": {
                "parent": None,
                "records": [_record(10, "a", 1), _record(11, "a", 2, "Applied#2026-11")],
                "closed": True,
            },
            "child-a": {"parent": "parent", "records": [_record(20, "a", 3)], "closed": False},
        }
    )

    keys, cursor = read_stream(streams, WalTable(FakeTable(), "wal"), None)
    again, _ = read_stream(streams, WalTable(FakeTable(), "wal"), cursor)

    assert keys == [WalKey("a", 1), WalKey("a", 3), WalKey("b", 1)]
    assert cursor["done"] == ["parent"]
    assert cursor["shards"] == {"parent": "11", "child-a": "20", "child-b": "30"}
    assert again == []


def test_a_trimmed_position_restarts_the_shard_at_trim_horizon():
    shard = {
        "parent": None,
        "records": [_record(50, "a", 7), _record(51, "a", 8)],
        "closed": False,
        "trimmed_below": 50,
    }
    streams = FakeStreams({"s": shard})

    keys, cursor = read_stream(
        streams, WalTable(FakeTable(), "wal"), {"stream_arn": ARN, "shards": {"s": "12"}, "done": []}
    )

    assert keys == [WalKey("a", 7), WalKey("a", 8)]
    assert cursor["shards"] == {"s": "51"}


def test_an_iterator_expiring_mid_read_keeps_what_was_read_and_restarts_next_time():
    streams = FakeStreams({"s": {"parent": None, "records": [_record(1, "a", 1)], "closed": False}})
    streams.fail_next_get_records = "ExpiredIteratorException"

    keys, cursor = read_stream(streams, WalTable(FakeTable(), "wal"), None)
    retried, _ = read_stream(streams, WalTable(FakeTable(), "wal"), cursor)

    assert keys == [] and cursor["shards"] == {"s": None}
    assert retried == [WalKey("a", 1)]


def test_shards_gone_from_the_stream_are_forgotten():
    streams = FakeStreams({"new": {"parent": None, "records": [], "closed": False}})
    old_cursor = {"stream_arn": ARN, "shards": {"old": "5", "new": None}, "done": ["old"]}

    _, cursor = read_stream(streams, WalTable(FakeTable(), "wal"), old_cursor)

    assert cursor == {"stream_arn": ARN, "shards": {"new": None}, "done": []}


def test_empty_pages_before_the_records_are_followed():
    streams = FakeStreams(
        {"s": {"parent": None, "records": [_record(1, "a", 1)], "closed": False, "leading_empty_pages": 2}}
    )

    keys, _ = read_stream(streams, WalTable(FakeTable(), "wal"), None)

    assert keys == [WalKey("a", 1)]
