"""Dataset-table fixtures: a WAL on moto (from ../conftest.py), the shared Spark session, and dataset ids
of the test's own whose tables are dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from runstate.config import settings
from runstate.wal import DatasetReader, WalProducer, flush_dataset
from runstate.wal import layout as t
from runstate.wal.changes import Change, fold
from runstate.wal.dataset_tables import BlobLocation
from runstate.wal.dataset_tables.naming import NAMESPACE, table_name
from runstate_tests.support.spark import drop_iceberg_table


@pytest.fixture
def location(wal) -> BlobLocation:
    return BlobLocation(bucket=wal.bucket, prefix=wal.prefix, endpoint_url=wal.endpoint)


@pytest.fixture
def dataset_ids(spark, spark_settings) -> Iterator[Callable[[str], str]]:
    """new_id(stem) -> a unique dataset id; every table made for one is dropped after the test."""
    made: list[str] = []

    def new_id(stem: str = "ds") -> str:
        made.append(f"{stem}{uuid.uuid4().hex[:8]}")
        return made[-1]

    yield new_id
    for dataset_id in made:
        drop_iceberg_table(spark, spark_settings.warehouse_dir, NAMESPACE, table_name(dataset_id))


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


@pytest.fixture
def feed(wal) -> Feed:
    return Feed(wal)


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
