"""Blob layout, deterministic Parquet, and the manifest's conditional writes."""

from __future__ import annotations

import pytest

from runstate.wal.blobs import (
    BlobRef,
    Manifest,
    archive_key,
    delta_key,
    snapshot_key,
)
from runstate.wal.codec import decode_snapshot, encode_snapshot


def test_key_layout():
    assert delta_key("datasets/", "orders", 1, 500) == (
        "datasets/orders/delta/00000000000000000001-00000000000000000500.parquet"
    )
    assert snapshot_key("datasets/", "orders", 42) == "datasets/orders/snapshot/00000000000000000042.parquet"
    assert archive_key("datasets/", "orders", delta_key("datasets/", "orders", 1, 2)) == (
        "datasets/orders/archive/delta/00000000000000000001-00000000000000000002.parquet"
    )


def test_snapshot_encoding_is_deterministic_and_round_trips():
    state = {"b": [1, {"x": None}], 3: "three", "a": 1.5}

    first = encode_snapshot(state)
    second = encode_snapshot(dict(reversed(list(state.items()))))

    assert first == second
    assert decode_snapshot(first) == state


def test_only_one_of_two_writers_holding_the_same_manifest_wins(wal):
    ref = BlobRef("k1", "0" * 64, 10, 1, 1, 1)
    wal.blob_store().write_manifest(Manifest("orders").with_delta(ref), None)
    seen = wal.blob_store().read_manifest("orders")

    first = wal.blob_store().write_manifest(seen.with_delta(BlobRef("k2", "1" * 64, 10, 2, 2, 1)), seen.etag)
    second = wal.blob_store().write_manifest(seen.with_delta(BlobRef("k3", "2" * 64, 10, 2, 2, 1)), seen.etag)

    assert (first, second) == (True, False)
    assert [r.key for r in wal.blob_store().read_manifest("orders").deltas] == ["k1", "k2"]


def test_a_first_manifest_cannot_overwrite_an_existing_one(wal):
    manifest = Manifest("orders").with_delta(BlobRef("k1", "0" * 64, 10, 1, 1, 1))
    assert wal.blob_store().write_manifest(manifest, None)

    assert not wal.blob_store().write_manifest(Manifest("orders"), None)


def test_a_delta_that_would_leave_a_gap_is_refused():
    with pytest.raises(ValueError, match="gap"):
        Manifest("orders").with_delta(BlobRef("k", "0" * 64, 1, 2, 3, 1))
