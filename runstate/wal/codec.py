"""The blobs' bytes: deterministic Parquet for deltas and snapshots (pyarrow is imported on first use).

A delta holds the WAL rows first..last as columns (seq, pos, op, key, value); a snapshot holds the whole
state as (key, value), sorted by key. Keys and values are canonical JSON text, so int and str keys stay
distinct and the same rows always give the same bytes (for one pyarrow version).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping
from typing import Any

from runstate.wal.changes import DELETE, UPSERT, Change, Key, canonical_json

# pyarrow costs about a second to import: the code location and the fast CLI verbs never need it.
_SCHEMAS: dict[str, Any] = {}


def delta_schema() -> Any:
    if "delta" not in _SCHEMAS:
        import pyarrow as pa

        _SCHEMAS["delta"] = pa.schema(
            [
                ("seq", pa.int64()),
                ("pos", pa.int32()),
                ("op", pa.string()),
                ("key", pa.string()),
                ("value", pa.string()),
            ]
        )
    return _SCHEMAS["delta"]


def snapshot_schema() -> Any:
    if "snapshot" not in _SCHEMAS:
        import pyarrow as pa

        _SCHEMAS["snapshot"] = pa.schema([("key", pa.string()), ("value", pa.string())])
    return _SCHEMAS["snapshot"]


def _parquet_bytes(table: Any) -> bytes:
    import pyarrow.parquet as pq

    # Fixed writer options: the same rows always give the same bytes.
    sink = io.BytesIO()
    pq.write_table(
        table,
        sink,
        compression="zstd",
        compression_level=3,
        use_dictionary=False,
        write_statistics=False,
        store_schema=False,
        version="2.6",
    )
    return sink.getvalue()


def _read_columns(data: bytes) -> dict[str, list[Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # One file, read on this thread from Arrow's own buffer: pq.read_table's dataset scanner, and a
    # ParquetFile over a Python file object (io.BytesIO), start Arrow's thread pools, whose threads then
    # raced the interpreter's exit (SIGABRT, "terminate called without an active exception", 4 runs in
    # 60 of a script that read blobs; apache/arrow#34314). pa.BufferReader starts no thread.
    return pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False).to_pydict()


def encode_delta(rows: Iterable[tuple[int, list[Change]]]) -> tuple[bytes, int]:
    """Parquet of (seq, changes) rows in seq order; returns (bytes, number of changes)."""
    import pyarrow as pa

    seqs, positions, ops, keys, values = [], [], [], [], []
    for seq, changes in sorted(rows, key=lambda row: row[0]):
        for position, change in enumerate(changes):
            seqs.append(seq)
            positions.append(position)
            ops.append(change.op)
            keys.append(canonical_json(change.key))
            values.append(None if change.op == DELETE else canonical_json(change.value))
    table = pa.Table.from_arrays(
        [
            pa.array(seqs, pa.int64()),
            pa.array(positions, pa.int32()),
            pa.array(ops, pa.string()),
            pa.array(keys, pa.string()),
            pa.array(values, pa.string()),
        ],
        schema=delta_schema(),
    )
    return _parquet_bytes(table), len(seqs)


def decode_delta(data: bytes) -> list[tuple[int, Change]]:
    """(seq, change) pairs in (seq, position) order."""
    columns = _read_columns(data)
    order = sorted(range(len(columns["seq"])), key=lambda i: (columns["seq"][i], columns["pos"][i]))
    pairs = []
    for i in order:
        key = json.loads(columns["key"][i])
        if columns["op"][i] == DELETE:
            change = Change(DELETE, key, None)
        else:
            change = Change(UPSERT, key, json.loads(columns["value"][i]))
        pairs.append((columns["seq"][i], change))
    return pairs


def warm_up() -> None:
    """Encode and decode a one-row delta: a process's first Parquet encode loads pyarrow's kernels (0.5 s
    on a quiet machine, seconds on a loaded one). A flush run that waits for rows does it before it
    holds its shard, so the first row it flushes does not pay for it."""
    data, _ = encode_delta([(1, [Change.upsert("warm-up", 1)])])
    decode_delta(data)


def encode_snapshot(state: Mapping[Key, Any]) -> bytes:
    import pyarrow as pa

    items = sorted((canonical_json(key), canonical_json(value)) for key, value in state.items())
    table = pa.Table.from_arrays(
        [pa.array([k for k, _ in items], pa.string()), pa.array([v for _, v in items], pa.string())],
        schema=snapshot_schema(),
    )
    return _parquet_bytes(table)


def decode_snapshot(data: bytes) -> dict[Key, Any]:
    columns = _read_columns(data)
    return {json.loads(k): json.loads(v) for k, v in zip(columns["key"], columns["value"])}
