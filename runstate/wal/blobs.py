"""Blobs in S3: deterministic Parquet encoding, the key layout, sha256 checks and the manifest.

Layout under `{prefix}{dataset}/`:
- `delta/{first:020d}-{last:020d}.parquet`: the WAL rows first..last (columns seq, pos, op, key, value);
- `snapshot/{version:020d}.parquet`: the whole state at `version` (columns key, value), sorted by key;
- `archive/...`: retired blobs moved out of the way by compaction;
- `manifest.json`: what a reader reads: version, latest snapshot, the ordered deltas after it, each
  with its sha256, and the blobs retired by compaction (kept until their grace period ends).
Keys and values are stored as canonical JSON text so int and str keys stay distinct and bytes are stable.
The manifest is only ever replaced with a conditional put (IfMatch its ETag, or IfNoneMatch='*' for the
first one), so two writers can never clobber each other's update.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq
from botocore.exceptions import ClientError

from runstate.wal.changes import DELETE, Change, Key, canonical_json, sha256_hex
from runstate.wal.errors import BlobIntegrityError

MANIFEST_FORMAT = 1
DELTA_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("pos", pa.int32()),
        ("op", pa.string()),
        ("key", pa.string()),
        ("value", pa.string()),
    ]
)
SNAPSHOT_SCHEMA = pa.schema([("key", pa.string()), ("value", pa.string())])
PRECONDITION_CODES = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")


def dataset_root(prefix: str, dataset_id: str) -> str:
    return f"{prefix}{dataset_id}/"


def delta_key(prefix: str, dataset_id: str, first_seq: int, last_seq: int) -> str:
    return f"{dataset_root(prefix, dataset_id)}delta/{first_seq:020d}-{last_seq:020d}.parquet"


def snapshot_key(prefix: str, dataset_id: str, version: int) -> str:
    return f"{dataset_root(prefix, dataset_id)}snapshot/{version:020d}.parquet"


def manifest_key(prefix: str, dataset_id: str) -> str:
    return f"{dataset_root(prefix, dataset_id)}manifest.json"


def archive_key(prefix: str, dataset_id: str, key: str) -> str:
    """`.../delta/x.parquet` -> `.../archive/delta/x.parquet`."""
    root = dataset_root(prefix, dataset_id)
    return f"{root}archive/{key[len(root):]}" if key.startswith(root) else f"{root}archive/{key}"


# --- Parquet -----------------------------------------------------------------------------------------


def _parquet_bytes(table: pa.Table) -> bytes:
    # Fixed writer options: the same rows always give the same bytes (for one pyarrow version).
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


def encode_delta(rows: Iterable[tuple[int, list[Change]]]) -> tuple[bytes, int]:
    """Parquet of (seq, changes) rows in seq order; returns (bytes, number of changes)."""
    seqs, positions, ops, keys, values = [], [], [], [], []
    for seq, changes in sorted(rows, key=lambda row: row[0]):
        for position, change in enumerate(changes):
            seqs.append(seq)
            positions.append(position)
            ops.append(change.op)
            keys.append(canonical_json(change.key))
            values.append(None if change.op == DELETE else canonical_json(change.value))
    table = pa.Table.from_arrays(
        [pa.array(seqs, pa.int64()), pa.array(positions, pa.int32()), pa.array(ops, pa.string()),
         pa.array(keys, pa.string()), pa.array(values, pa.string())],
        schema=DELTA_SCHEMA,
    )
    return _parquet_bytes(table), len(seqs)


def decode_delta(data: bytes) -> list[tuple[int, Change]]:
    """(seq, change) pairs in (seq, position) order."""
    table = pq.read_table(io.BytesIO(data))
    columns = table.to_pydict()
    pairs = []
    order = sorted(range(table.num_rows), key=lambda i: (columns["seq"][i], columns["pos"][i]))
    for i in order:
        key = json.loads(columns["key"][i])
        if columns["op"][i] == DELETE:
            change = Change(DELETE, key, None)
        else:
            change = Change("upsert", key, json.loads(columns["value"][i]))
        pairs.append((columns["seq"][i], change))
    return pairs


def encode_snapshot(state: Mapping[Key, Any]) -> bytes:
    items = sorted((canonical_json(key), canonical_json(value)) for key, value in state.items())
    table = pa.Table.from_arrays(
        [pa.array([k for k, _ in items], pa.string()), pa.array([v for _, v in items], pa.string())],
        schema=SNAPSHOT_SCHEMA,
    )
    return _parquet_bytes(table)


def decode_snapshot(data: bytes) -> dict[Key, Any]:
    columns = pq.read_table(io.BytesIO(data)).to_pydict()
    return {json.loads(k): json.loads(v) for k, v in zip(columns["key"], columns["value"])}


# --- blobs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlobRef:
    """A blob the manifest points at: its key, sha256, size and the seq range it covers."""

    key: str
    sha256: str
    bytes: int
    first_seq: int
    last_seq: int
    rows: int

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "sha256": self.sha256, "bytes": self.bytes,
                "first_seq": self.first_seq, "last_seq": self.last_seq, "rows": self.rows}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "BlobRef":
        return cls(str(data["key"]), str(data["sha256"]), int(data["bytes"]), int(data["first_seq"]),
                   int(data["last_seq"]), int(data["rows"]))


@dataclass(frozen=True)
class RetiredBlob:
    """A blob no manifest references any more; deleted (archived) once `retired_at + grace` has passed."""

    key: str
    sha256: str
    retired_at: float

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "sha256": self.sha256, "retired_at": self.retired_at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RetiredBlob":
        return cls(str(data["key"]), str(data["sha256"]), float(data["retired_at"]))


def put_blob(s3: Any, bucket: str, key: str, data: bytes) -> None:
    """Idempotent: the key is deterministic and so are the bytes. S3 stores and checks a SHA256 checksum."""
    s3.put_object(Bucket=bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256")


def get_verified_blob(s3: Any, bucket: str, dataset_id: str, key: str, expected_sha256: str) -> bytes:
    """The blob's bytes, or BlobIntegrityError naming it when it is missing or its sha256 differs."""
    try:
        data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as error:
        if error.response["Error"]["Code"] in ("NoSuchKey", "404", "NotFound"):
            raise BlobIntegrityError(f"dataset {dataset_id!r}: blob {key} is missing") from None
        raise
    actual = sha256_hex(data)
    if actual != expected_sha256:
        raise BlobIntegrityError(
            f"dataset {dataset_id!r}: blob {key} checksum mismatch "
            f"(expected {expected_sha256[:12]}.., got {actual[:12]}..)"
        )
    return data


# --- manifest ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    """What a reader reads: state = snapshot (if any) + deltas in order, consistent up to `version`."""

    dataset_id: str
    version: int = 0
    snapshot: BlobRef | None = None
    deltas: tuple[BlobRef, ...] = ()
    retired: tuple[RetiredBlob, ...] = ()
    etag: str | None = field(default=None, compare=False)

    def blobs(self) -> list[BlobRef]:
        return ([self.snapshot] if self.snapshot else []) + list(self.deltas)

    def blob_for_seq(self, seq: int) -> BlobRef | None:
        for ref in reversed(self.blobs()):
            if ref.first_seq <= seq <= ref.last_seq:
                return ref
        return None

    def with_delta(self, ref: BlobRef) -> "Manifest":
        if ref.first_seq != self.version + 1:
            raise ValueError(
                f"dataset {self.dataset_id!r}: delta {ref.key} starts at seq {ref.first_seq}, "
                f"manifest is at {self.version}: that would leave a gap"
            )
        return replace(self, version=ref.last_seq, deltas=self.deltas + (ref,))

    def to_bytes(self) -> bytes:
        body = {
            "format": MANIFEST_FORMAT,
            "dataset_id": self.dataset_id,
            "version": self.version,
            "snapshot": self.snapshot.to_json() if self.snapshot else None,
            "deltas": [ref.to_json() for ref in self.deltas],
            "retired": [blob.to_json() for blob in self.retired],
        }
        return canonical_json(body).encode("utf-8")

    @classmethod
    def from_bytes(cls, dataset_id: str, key: str, data: bytes, etag: str | None) -> "Manifest":
        try:
            body = json.loads(data)
            if body.get("format") != MANIFEST_FORMAT or body.get("dataset_id") != dataset_id:
                raise ValueError(f"format {body.get('format')!r}, dataset {body.get('dataset_id')!r}")
            return cls(
                dataset_id=dataset_id,
                version=int(body["version"]),
                snapshot=BlobRef.from_json(body["snapshot"]) if body.get("snapshot") else None,
                deltas=tuple(BlobRef.from_json(ref) for ref in body["deltas"]),
                retired=tuple(RetiredBlob.from_json(blob) for blob in body.get("retired", [])),
                etag=etag,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise BlobIntegrityError(f"dataset {dataset_id!r}: manifest {key} is corrupt ({error})") from None


def read_manifest(s3: Any, bucket: str, prefix: str, dataset_id: str) -> Manifest:
    """The dataset's manifest with its ETag; an empty manifest (version 0, etag None) when there is none."""
    key = manifest_key(prefix, dataset_id)
    try:
        response = s3.get_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response["Error"]["Code"] in ("NoSuchKey", "404", "NotFound"):
            return Manifest(dataset_id)
        raise
    return Manifest.from_bytes(dataset_id, key, response["Body"].read(), response["ETag"])


def write_manifest(s3: Any, bucket: str, prefix: str, manifest: Manifest, expected_etag: str | None) -> bool:
    """Replace the manifest only if it is still `expected_etag` (None: only if absent); False if it moved."""
    key = manifest_key(prefix, manifest.dataset_id)
    condition = {"IfMatch": expected_etag} if expected_etag else {"IfNoneMatch": "*"}
    try:
        s3.put_object(
            Bucket=bucket, Key=key, Body=manifest.to_bytes(), ContentType="application/json",
            ChecksumAlgorithm="SHA256", **condition,
        )
    except ClientError as error:
        code = error.response["Error"]["Code"]
        status = str(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        if code in PRECONDITION_CODES or status in ("412", "409"):
            return False
        raise
    return True
