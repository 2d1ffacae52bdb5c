"""The one adapter between the dataset tables and the WAL's blobs.

It reads a dataset's manifest, plans which blobs a merge needs, and reads them inside Spark tasks:
each task fetches its blobs with boto3, checks their sha256 with the WAL's own verifier and decodes
the Parquet into change rows. No Hadoop S3 connector is needed, the same code runs on a cluster, and
no row ever passes through the driver process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from runstate import defaults
from runstate.wal.blobs import BlobStore, Manifest
from runstate.wal.changes import DELETE
from runstate.wal.clients import aws_client
from runstate.wal.dataset_tables.errors import DatasetTableError

if TYPE_CHECKING:
    import pyarrow as pa

SNAPSHOT, DELTA = "snapshot", "delta"
# Arrow schema of the change rows a task yields, and the same as Spark DDL.
CHANGE_COLUMNS = "key STRING, value STRING, wal_seq BIGINT, pos INT, deleted BOOLEAN"
BLOB_COLUMNS = "dataset_id STRING, key STRING, sha256 STRING, kind STRING, after_seq BIGINT, version BIGINT"


@dataclass(frozen=True)
class BlobLocation:
    """Where the blobs are, shipped to every Spark task (credentials None: the executor's own chain)."""

    bucket: str
    prefix: str
    endpoint_url: str | None = None
    region: str = defaults.AWS_REGION
    access_key_id: str | None = None
    secret_access_key: str | None = None

    def client(self) -> Any:
        """A client per task; the Python worker (reused across tasks) keeps the session it comes from."""
        return aws_client(
            "s3",
            endpoint_url=self.endpoint_url,
            region=self.region,
            access_key_id=self.access_key_id,
            secret_access_key=self.secret_access_key,
        )

    def blob_store(self, s3: Any = None) -> BlobStore:
        return BlobStore(s3 or self.client(), self.bucket, self.prefix)

    def manifest(self, s3: Any, dataset_id: str) -> Manifest:
        return self.blob_store(s3).read_manifest(dataset_id)


@dataclass(frozen=True)
class BlobRead:
    """One blob a merge reads: delta rows with seq <= after_seq are dropped; a snapshot's rows all get
    wal_seq = version (the seq it covers up to)."""

    dataset_id: str
    key: str
    sha256: str
    kind: str
    after_seq: int
    version: int


@dataclass(frozen=True)
class MergePlan:
    dataset_id: str
    from_version: int
    to_version: int
    reads: tuple[BlobRead, ...]
    full: bool  # snapshot + every delta: keys absent from them are deleted in the table
    rebuild: bool = False  # full, and the table is made equal to the blobs, whatever it held


def plan_merge(manifest: Manifest, table_version: int, rebuild: bool = False) -> MergePlan:
    """The blobs that bring a table at `table_version` to the manifest's version.

    Incremental when the deltas after the table's version are all still in the manifest; a full read
    (snapshot + every delta) when asked to rebuild, or when compaction has folded deltas the table has
    not seen into the snapshot. A table ahead of the manifest is refused: manifests only grow, so its
    dataset's blobs started over (moto and fakesnow keep everything in memory) and only a rebuild
    can say which of its rows are still true.
    """
    dataset_id, version = manifest.dataset_id, manifest.version
    if table_version > version and not rebuild:
        raise DatasetTableError(
            f"dataset {dataset_id!r}: its table is at version {table_version}, ahead of the dataset's "
            f"manifest (version {version}): the WAL and its blobs started over (an emulator restart?) or "
            f"are not the ones the table was merged from; run `runstate wal merge --dataset {dataset_id} "
            "--rebuild` to make the table equal to the blobs"
        )
    snapshot = manifest.snapshot
    full = rebuild or (snapshot is not None and table_version < snapshot.last_seq)
    if not full and table_version >= version:
        return MergePlan(dataset_id, table_version, version, (), False)
    reads = []
    if full and snapshot is not None:
        reads.append(BlobRead(dataset_id, snapshot.key, snapshot.sha256, SNAPSHOT, 0, snapshot.last_seq))
    after = 0 if full else table_version
    for ref in manifest.deltas:
        if ref.last_seq > after:
            reads.append(BlobRead(dataset_id, ref.key, ref.sha256, DELTA, after, version))
    return MergePlan(dataset_id, table_version, version, tuple(reads), full, rebuild)


def blob_reads_frame(spark: Any, reads: tuple[BlobRead, ...]) -> Any:
    """A small DataFrame of blob reads in one slice per core (no shuffle): each task reads its share of
    the blobs in turn, on one S3 client."""
    slices = max(1, min(len(reads), spark.sparkContext.defaultParallelism))
    rows = spark.sparkContext.parallelize([tuple(asdict(read).values()) for read in reads], slices)
    return spark.createDataFrame(rows, BLOB_COLUMNS)


Batches = Iterator["pa.RecordBatch"]


def change_reader(location: BlobLocation) -> Callable[[Batches], Batches]:
    """The `mapInArrow` function: blob-read rows in, change rows out (checksums verified in the task)."""

    def read_partition(batches: Batches) -> Batches:
        blobs = _blob_store(location)
        for batch in batches:
            for read in batch.to_pylist():
                data = blobs.get_verified(read["dataset_id"], read["key"], read["sha256"])
                yield from _change_batches(data, read)

    return read_partition


@lru_cache(maxsize=8)
def _blob_store(location: BlobLocation) -> BlobStore:
    """One client per location in each (reused) Python worker: creating one costs more than a small blob."""
    return location.blob_store()


def _change_batches(data: bytes, read: dict[str, Any]) -> Batches:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(pa.BufferReader(data)).iter_batches(batch_size=65536, use_threads=False):
        rows = batch.num_rows
        if read["kind"] == SNAPSHOT:
            version = pa.repeat(pa.scalar(read["version"], pa.int64()), rows)
            yield pa.RecordBatch.from_arrays(
                [
                    batch.column("key"),
                    batch.column("value"),
                    version,
                    pa.repeat(pa.scalar(0, pa.int32()), rows),
                    pa.repeat(pa.scalar(False), rows),
                ],
                names=["key", "value", "wal_seq", "pos", "deleted"],
            )
            continue
        batch = batch.filter(pc.greater(batch.column("seq"), read["after_seq"]))
        yield pa.RecordBatch.from_arrays(
            [
                batch.column("key"),
                batch.column("value"),
                batch.column("seq"),
                batch.column("pos"),
                pc.equal(batch.column("op"), DELETE),
            ],
            names=["key", "value", "wal_seq", "pos", "deleted"],
        )


def publish_delta(s3: Any, location: BlobLocation, dataset_id: str, rows: list[tuple[int, list[Any]]]) -> int:
    """Write (seq, changes) rows as the dataset's next delta blob and commit it to the manifest, with the
    WAL's own encoder and conditional manifest put. For loads that do not come through DynamoDB (the
    benchmark's millions of changes); returns the new version."""
    from runstate.wal.errors import WalContentionError

    blobs = location.blob_store(s3)
    manifest = blobs.read_manifest(dataset_id)
    ref = blobs.put_delta(dataset_id, rows)
    updated = manifest.with_delta(ref)
    if not blobs.write_manifest(updated, manifest.etag):
        raise WalContentionError(
            f"dataset {dataset_id!r}: the manifest moved while delta {ref.key} was published"
        )
    return updated.version
