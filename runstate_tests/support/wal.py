"""The WAL tests' environment (a table and bucket of the test's own), a feed through the real producer and
flush, and the CLI on a test's WAL."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from click.testing import CliRunner

from runstate.config import settings
from runstate.wal import BlobStore, DatasetReader, WalProducer, WalTable, flush_dataset
from runstate.wal import layout as t
from runstate.wal.changes import Change, fold

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


class Feed:
    """Appends through the real producer and flushes through the real flush, remembering every change."""

    def __init__(self, wal: Any) -> None:
        self.wal = wal
        self.producer = WalProducer(wal.dynamodb, wal.table)
        self.changes: dict[str, dict[int, list[Change]]] = {}

    def append(self, dataset_id: str, changes: list[Change]) -> int:
        seq = self.producer.append(dataset_id, changes)
        self.changes.setdefault(dataset_id, {})[seq] = changes
        return seq

    def flush(self, dataset_id: str) -> int:
        rows = self.wal.wal_table().query_rows(dataset_id)
        seqs = [int(item[t.SEQ_NO]["N"]) for item in rows]
        result = flush_dataset(*self.wal.owners(), dataset_id, seqs)
        return result.version or result.last_seq

    def fold(self, dataset_id: str, version: int) -> dict:
        seqs = self.changes.get(dataset_id, {})
        return fold({}, (c for seq in sorted(seqs) if seq <= version for c in seqs[seq]))

    def reader(self, dataset_id: str) -> DatasetReader:
        return DatasetReader(self.wal.s3, self.wal.bucket, self.wal.prefix, dataset_id)


def cli_on(
    monkeypatch: pytest.MonkeyPatch, wal: Any, spark_settings: Any, **more: str
) -> Iterator[CliRunner]:
    """The CLI on the test's WAL and on the catalog and warehouse of `spark_settings` (`more`: other
    RUNSTATE_* variables, e.g. a cluster's master), its settings read afresh and forgotten afterwards."""
    for name, value in {
        "RUNSTATE_AWS_ENDPOINT_URL": wal.endpoint,
        "RUNSTATE_WAL_TABLE": wal.table,
        "RUNSTATE_BLOB_BUCKET": wal.bucket,
        "RUNSTATE_BLOB_PREFIX": wal.prefix,
        "RUNSTATE_PG_URL": spark_settings.pg_url,
        "RUNSTATE_WAREHOUSE": str(spark_settings.warehouse_dir),
        **more,
    }.items():
        monkeypatch.setenv(name, value)
    settings.cache_clear()
    yield CliRunner()
    settings.cache_clear()
