"""WAL test fixtures: a fresh WAL table and blob bucket on moto's server for every test."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest

from runstate.wal import BlobStore, WalTable, ensure_blob_bucket, ensure_wal_table

logging.getLogger("werkzeug").setLevel(logging.ERROR)

PREFIX = "datasets/"


@dataclass
class WalEnv:
    endpoint: str
    dynamodb: Any
    s3: Any
    streams: Any
    table: str
    bucket: str
    prefix: str = PREFIX

    def client(self, service: str) -> Any:
        """A new real client of its own (fault hooks registered on it touch nothing else)."""
        return boto3.client(service, endpoint_url=self.endpoint, region_name="us-east-1")

    def target(self) -> dict[str, str]:
        return {"table": self.table, "bucket": self.bucket, "prefix": self.prefix}

    def wal_table(self) -> WalTable:
        return WalTable(self.dynamodb, self.table)

    def blob_store(self) -> BlobStore:
        return BlobStore(self.s3, self.bucket, self.prefix)

    def owners(self) -> tuple[WalTable, BlobStore]:
        """The core's owners of this test's table and bucket."""
        return self.wal_table(), self.blob_store()


@pytest.fixture
def wal(moto_endpoint: str, dynamodb: Any, s3: Any) -> Iterator[WalEnv]:
    env = WalEnv(
        endpoint=moto_endpoint,
        dynamodb=dynamodb,
        s3=s3,
        streams=boto3.client("dynamodbstreams", endpoint_url=moto_endpoint, region_name="us-east-1"),
        table=f"wal_{uuid.uuid4().hex[:10]}",
        bucket=f"blobs-{uuid.uuid4().hex[:12]}",
    )
    ensure_wal_table(dynamodb, env.table)
    ensure_blob_bucket(s3, env.bucket)
    yield env
    dynamodb.delete_table(TableName=env.table)
