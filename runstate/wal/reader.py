"""The consumer side: a dataset's state = latest snapshot + its deltas, every blob's sha256 verified.

The reader hashes each blob's bytes and compares them with the sha256 the manifest recorded, whatever
the store checked on upload. A missing or corrupt blob, or a corrupt manifest, raises
BlobIntegrityError naming it: never a silently stale or partial state.

Keys are typed: an int key 1 and a str key "1" are two keys (the blobs store keys as canonical JSON).
`state_document` keeps them apart in JSON, whose object keys are always strings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runstate.wal.blobs import BlobStore, Manifest, manifest_key
from runstate.wal.changes import Key, fold, validate_dataset_id
from runstate.wal.codec import decode_delta, decode_snapshot
from runstate.wal.errors import BlobIntegrityError


class DatasetReader:
    """Reads one dataset's consistent state from the blob bucket.

    `last_applied_seq`, when given, is asked only when the manifest is absent: a dataset with applied
    WAL rows and no manifest lost its blobs, and reading it as empty would be a silent wrong answer.
    """

    def __init__(
        self,
        s3_client: Any,
        bucket: str,
        prefix: str,
        dataset_id: str,
        *,
        last_applied_seq: Callable[[], int] | None = None,
    ) -> None:
        self.s3 = s3_client
        self.bucket = bucket
        self.prefix = prefix
        self.dataset_id = validate_dataset_id(dataset_id)
        self.blobs = BlobStore(s3_client, bucket, prefix)
        self.last_applied_seq = last_applied_seq

    @classmethod
    def of(
        cls, blobs: BlobStore, dataset_id: str, *, last_applied_seq: Callable[[], int] | None = None
    ) -> DatasetReader:
        return cls(blobs.client, blobs.bucket, blobs.prefix, dataset_id, last_applied_seq=last_applied_seq)

    @property
    def version(self) -> int:
        """The highest applied seq of the consistent prefix, read fresh from the manifest."""
        return self.manifest().version

    def manifest(self) -> Manifest:
        manifest = self.blobs.read_manifest(self.dataset_id)
        if manifest.etag is None and self.last_applied_seq is not None:
            applied = self.last_applied_seq()
            if applied:
                raise BlobIntegrityError(
                    f"dataset {self.dataset_id!r}: manifest {manifest_key(self.prefix, self.dataset_id)} is "
                    f"missing, but its WAL rows up to seq {applied} are applied: the blobs were lost or deleted"
                )
        return manifest

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
            state = decode_snapshot(self._blob(manifest.snapshot.key, manifest.snapshot.sha256))
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
                f"dataset {self.dataset_id!r}: manifest version {manifest.version} "
                f"but its blobs end at {expected_next - 1}"
            )
        return state

    def _blob(self, key: str, sha256: str) -> bytes:
        return self.blobs.get_verified(self.dataset_id, key, sha256)


def state_document(dataset_id: str, version: int, state: dict[Key, Any]) -> dict[str, Any]:
    """What `runstate wal read` prints: str keys under "state", int keys (as decimal text) under "int_state".

    JSON object keys are strings, so one object cannot hold both the int key 1 and the str key "1":
    each type gets its own object, and both keys survive the round trip.
    """
    return {
        "dataset": dataset_id,
        "version": version,
        "state": {key: value for key, value in state.items() if isinstance(key, str)},
        "int_state": {
            str(key): value for key, value in sorted((k, v) for k, v in state.items() if isinstance(k, int))
        },
    }
