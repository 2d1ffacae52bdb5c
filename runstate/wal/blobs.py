"""Blobs in S3: the key layout, the manifest, and BlobStore, the one owner of the bucket (codec.py: bytes).

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

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from runstate.wal.changes import Change, Key, canonical_json, sha256_hex
from runstate.wal.codec import encode_delta, encode_snapshot
from runstate.wal.errors import BlobIntegrityError, WalServiceError

MANIFEST_FORMAT = 1
PRECONDITION_CODES = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")
MISSING_CODES = ("NoSuchKey", "404", "NotFound")


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
    return f"{root}archive/{key[len(root) :]}" if key.startswith(root) else f"{root}archive/{key}"


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
        return {
            "key": self.key,
            "sha256": self.sha256,
            "bytes": self.bytes,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "rows": self.rows,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BlobRef:
        return cls(
            str(data["key"]),
            str(data["sha256"]),
            int(data["bytes"]),
            int(data["first_seq"]),
            int(data["last_seq"]),
            int(data["rows"]),
        )


@dataclass(frozen=True)
class RetiredBlob:
    """A blob no manifest references any more; deleted (archived) once `retired_at + grace` has passed."""

    key: str
    sha256: str
    retired_at: float

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "sha256": self.sha256, "retired_at": self.retired_at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RetiredBlob:
        return cls(str(data["key"]), str(data["sha256"]), float(data["retired_at"]))


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

    def with_delta(self, ref: BlobRef) -> Manifest:
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
    def from_bytes(cls, dataset_id: str, key: str, data: bytes, etag: str | None) -> Manifest:
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


class BlobStore:
    """The one owner of the blob bucket: blobs and manifests under `prefix` in `bucket` (thread-safe).

    A driver error leaves it as a WalServiceError naming the bucket and the endpoint; a missing blob
    or a checksum mismatch is a BlobIntegrityError naming the blob.
    """

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix

    def _service_error(self, error: Exception) -> WalServiceError:
        where = getattr(self.client.meta, "endpoint_url", None) or "AWS"
        code = _code(error)
        if code == "NoSuchBucket":
            return WalServiceError(
                f"blob bucket {self.bucket!r} not found at {where}; run `runstate services up`"
            )
        return WalServiceError(f"blob bucket {self.bucket!r} at {where}: {code}: {error}")

    def _call(self, operation: str, **request: Any) -> dict[str, Any]:
        try:
            return getattr(self.client, operation)(Bucket=self.bucket, **request)
        except (ClientError, BotoCoreError) as error:
            raise self._service_error(error) from error

    # --- blobs ---------------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        """Idempotent: the key is deterministic and so are the bytes. S3 stores and checks a SHA256 checksum."""
        self._call("put_object", Key=key, Body=data, ChecksumAlgorithm="SHA256")

    def get_verified(self, dataset_id: str, key: str, expected_sha256: str) -> bytes:
        """The blob's bytes, or BlobIntegrityError naming it when it is missing or its sha256 differs."""
        try:
            data = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except ClientError as error:
            if _code(error) in MISSING_CODES:
                raise BlobIntegrityError(f"dataset {dataset_id!r}: blob {key} is missing") from None
            raise self._service_error(error) from error
        except BotoCoreError as error:
            raise self._service_error(error) from error
        actual = sha256_hex(data)
        if actual != expected_sha256:
            raise BlobIntegrityError(
                f"dataset {dataset_id!r}: blob {key} checksum mismatch "
                f"(expected {expected_sha256[:12]}.., got {actual[:12]}..)"
            )
        return data

    def put_delta(self, dataset_id: str, rows: list[tuple[int, list[Change]]]) -> BlobRef:
        """The delta blob of WAL rows first..last (in seq order), stored; its reference for the manifest."""
        data, changes = encode_delta(rows)
        first, last = rows[0][0], rows[-1][0]
        key = delta_key(self.prefix, dataset_id, first, last)
        self.put(key, data)
        return BlobRef(key, sha256_hex(data), len(data), first, last, changes)

    def put_snapshot(self, dataset_id: str, version: int, state: Mapping[Key, Any]) -> BlobRef:
        data = encode_snapshot(state)
        key = snapshot_key(self.prefix, dataset_id, version)
        self.put(key, data)
        return BlobRef(key, sha256_hex(data), len(data), 1, version, len(state))

    def archive(self, dataset_id: str, key: str) -> None:
        """Copy to archive/, then delete; re-running after a crash between the two finds the copy and deletes."""
        target = archive_key(self.prefix, dataset_id, key)
        try:
            self.client.copy_object(
                Bucket=self.bucket, Key=target, CopySource={"Bucket": self.bucket, "Key": key}
            )
        except ClientError as error:
            if _code(error) not in MISSING_CODES:
                raise self._service_error(error) from error
            self._call("head_object", Key=target)  # the source is gone: the copy must already exist
        except BotoCoreError as error:
            raise self._service_error(error) from error
        self._call("delete_object", Key=key)

    def keys(self, dataset_id: str, kind: str = "delta") -> list[str]:
        """The dataset's blob keys of one kind (delta, snapshot, archive), sorted (boto3's paginator)."""
        prefix = f"{dataset_root(self.prefix, dataset_id)}{kind}/"
        return sorted(self._list(prefix))

    def _list(self, prefix: str) -> Iterator[str]:
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix
            ):
                yield from (obj["Key"] for obj in page.get("Contents", []))
        except (ClientError, BotoCoreError) as error:
            raise self._service_error(error) from error

    # --- manifests -------------------------------------------------------------------------------------

    def read_manifest(self, dataset_id: str) -> Manifest:
        """The dataset's manifest with its ETag; an empty manifest (version 0, etag None) when there is none."""
        key = manifest_key(self.prefix, dataset_id)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as error:
            if _code(error) in MISSING_CODES:
                return Manifest(dataset_id)
            raise self._service_error(error) from error
        except BotoCoreError as error:
            raise self._service_error(error) from error
        return Manifest.from_bytes(dataset_id, key, response["Body"].read(), response["ETag"])

    def write_manifest(self, manifest: Manifest, expected_etag: str | None) -> bool:
        """Replace the manifest only if it is still `expected_etag` (None: only if absent); False if it moved."""
        condition = {"IfMatch": expected_etag} if expected_etag else {"IfNoneMatch": "*"}
        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=manifest_key(self.prefix, manifest.dataset_id),
                Body=manifest.to_bytes(),
                ContentType="application/json",
                ChecksumAlgorithm="SHA256",
                **condition,
            )
        except ClientError as error:
            status = str(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if _code(error) in PRECONDITION_CODES or status in ("412", "409"):
                return False
            raise self._service_error(error) from error
        except BotoCoreError as error:
            raise self._service_error(error) from error
        return True

    def ensure(self) -> None:
        """Create the bucket if missing (idempotent)."""
        from runstate.wal.layout import ensure_blob_bucket

        ensure_blob_bucket(self.client, self.bucket)


def _code(error: Exception) -> str:
    return error.response["Error"]["Code"] if isinstance(error, ClientError) else type(error).__name__
