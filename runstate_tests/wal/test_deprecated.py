"""The public names that moved stay one release as aliases that warn."""

from __future__ import annotations

import importlib
import sys

import pytest

from runstate.wal import Change, DatasetReader, WalProducer, flush_batch
from runstate.wal.dataset_tables import DatasetTableError, table_ident


def test_the_lake_package_is_an_alias_of_dataset_tables_that_warns():
    sys.modules.pop("runstate.wal.lake", None)

    with pytest.warns(DeprecationWarning, match="runstate.wal.dataset_tables"):
        lake = importlib.import_module("runstate.wal.lake")

    assert lake.LakeError is DatasetTableError and lake.table_ident is table_ident


def test_flush_batch_warns_and_still_flushes(wal):
    WalProducer(wal.dynamodb, wal.table).append("orders", [Change.upsert("a", 1)])

    with pytest.warns(DeprecationWarning, match="flush_dataset"):
        result = flush_batch(wal.dynamodb, wal.s3, **wal.target(), dataset_id="orders", seqs=[1])

    assert result.version == 1
    assert DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").read() == (1, {"a": 1})
