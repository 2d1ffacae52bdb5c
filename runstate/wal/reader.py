"""The consumer side: a dataset's state = latest snapshot + its deltas, every blob's sha256 verified.

moto (and a misbehaving store) never verify S3 checksums, so the reader does: each blob's bytes are
hashed and compared with the sha256 the manifest recorded. A missing or corrupt blob, or a corrupt
manifest, raises BlobIntegrityError naming it: never a silently stale or partial state.
"""

from __future__ import annotations

from typing import Any

from runstate.wal.blobs import Manifest, decode_delta, decode_snapshot, get_verified_blob, read_manifest
from runstate.wal.changes import Key, fold, validate_dataset_id
from runstate.wal.errors import BlobIntegrityError


class DatasetReader:
    """Reads one dataset's consistent state from the blob bucket."""

    def __init__(self, s3_client: Any, bucket: str, prefix: str, dataset_id: str) -> None:
        self.s3 = s3_client
        self.bucket = bucket
        self.prefix = prefix
        self.dataset_id = validate_dataset_id(dataset_id)

    @property
    def version(self) -> int:
        """The highest applied seq of the consistent prefix, read fresh from the manifest."""
        return self.manifest().version

    def manifest(self) -> Manifest:
        return read_manifest(self.s3, self.bucket, self.prefix, self.dataset_id)

    def state(self) -> dict[Key, Any]:
        """The current state (fresh manifest, every blob verified)."""
        return self.read()[1]

    def read(self) -> tuple[int, dict[Key, Any]]:
        """(version, state) from one manifest, so the two always agree."""
        manifest = self.manifest()
        return manifest.version, self.state_at(manifest)

    def state_at(self, manifest: Manifest) -> dict[Key, Any]:
        """The state a given manifest describes (a reader may hold one while compaction switches it)."""
        state: dict[Key, Any] = {}
        expected_next = 1
        if manifest.snapshot is not None:
            data = self._blob(manifest.snapshot.key, manifest.snapshot.sha256)
            state = decode_snapshot(data)
            expected_next = manifest.snapshot.last_seq + 1
        for ref in manifest.deltas:
            if ref.first_seq != expected_next:
                raise BlobIntegrityError(
                    f"dataset {self.dataset_id!r}: manifest has a gap before delta {ref.key} "
                    f"(expected seq {expected_next}, delta starts at {ref.first_seq})"
                )
            changes = [change for _, change in decode_delta(self._blob(ref.key, ref.sha256))]
            state = fold(state, changes)
            expected_next = ref.last_seq + 1
        if expected_next - 1 != manifest.version:
            raise BlobIntegrityError(
                f"dataset {self.dataset_id!r}: manifest version {manifest.version} but its blobs end at {expected_next - 1}"
            )
        return state

    def _blob(self, key: str, sha256: str) -> bytes:
        return get_verified_blob(self.s3, self.bucket, self.dataset_id, key, sha256)
