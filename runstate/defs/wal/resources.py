"""`WalResource` (resource key `wal`): where the WAL table and the blob bucket live, plus lazy boto3 clients."""

from __future__ import annotations

import threading
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr, model_validator

from runstate.wal import BlobStore, WalTable
from runstate.wal.clients import aws_client


class WalResource(dg.ConfigurableResource):
    """The dataset WAL's AWS side: a DynamoDB table with a stream, and an S3 bucket for blobs.

    Configuration only: the deployment's values come from `runstate.defs.resources.wal_resource()`.
    Clients are created on first use, never at import or definition time.
    """

    endpoint_url: str | None = Field(
        default=None, description="AWS endpoint (moto's server in development); empty means AWS itself."
    )
    region: str = Field(default="us-east-1", description="AWS region.")
    table: str = Field(default="runstate_wal", description="The WAL table.")
    bucket: str = Field(default="runstate-blobs", description="The blob bucket.")
    prefix: str = Field(default="datasets/", description="Key prefix of every blob.")
    max_batch_size: int = Field(
        default=500, gt=0, description="The most WAL rows of one dataset that go into one delta blob."
    )
    flush_shards: int = Field(
        default=2, gt=0, description="Flush shards S: at most one flush run per shard at a time."
    )
    min_run_interval_s: float = Field(
        default=15.0,
        ge=0,
        description="A shard gets a new flush run at most this often: at most 2 runs per shard per 30 s timer.",
    )
    flush_workers: int = Field(default=8, gt=0, description="Datasets a shard run flushes in parallel.")
    flush_attempts: int = Field(
        default=3, gt=0, description="Tries per dataset in a shard run before reporting it."
    )
    flush_retry_delay_s: float = Field(
        default=1.0, ge=0, description="First wait between tries (doubled each time)."
    )
    stale_run_seconds: int = Field(
        default=900,
        ge=0,
        description="A flush run still STARTED after this long is taken as lost: its batch is planned again. "
        "Also set as the run's dagster/max_runtime so run monitoring fails it at the same moment.",
    )
    flush_linger_s: float = Field(
        default=0,
        ge=0,
        description="After its plan, a flush run keeps flushing its shard's new rows until none has come for "
        "this long (saves a run start per row; the deployment sets RUNSTATE_WAL_FLUSH_LINGER_S). 0: no linger.",
    )
    dataset_table_copy_on_write_max_mb: int = Field(
        default=16,
        ge=0,
        description="A dataset table merges copy-on-write up to this many MB of files, merge-on-read above "
        "(RUNSTATE_COPY_ON_WRITE_MAX_MB). 0: always merge-on-read.",
    )
    flush_run_budget_s: float = Field(
        default=240,
        ge=0,
        description="A lingering flush run takes no new rows after this long: runs stay short-lived.",
    )
    retention_days: int = Field(
        default=30, ge=0, description="Compaction trims Applied WAL rows older than this."
    )
    aws_access_key_id: str | None = Field(
        default=None, description="Pass as dg.EnvVar; empty uses boto3's chain."
    )
    aws_secret_access_key: str | None = Field(
        default=None, description="Pass as dg.EnvVar; empty uses boto3's chain."
    )

    @model_validator(mode="after")
    def _ends_before_it_looks_lost(self) -> WalResource:
        # A run still STARTED after stale_run_seconds is taken as lost and its plan flushed again.
        if (
            self.flush_linger_s
            and self.stale_run_seconds
            and self.flush_run_budget_s >= self.stale_run_seconds / 2
        ):
            raise ValueError(
                f"flush_run_budget_s ({self.flush_run_budget_s:g}) must be under half of stale_run_seconds "
                f"({self.stale_run_seconds}), or a lingering flush run would be taken for a lost one"
            )
        return self

    _clients: dict = PrivateAttr(default_factory=dict)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def _client(self, service: str) -> Any:
        with self._lock:
            if service not in self._clients:
                self._clients[service] = aws_client(
                    service,
                    endpoint_url=self.endpoint_url,
                    region=self.region,
                    access_key_id=_plain(self.aws_access_key_id),
                    secret_access_key=_plain(self.aws_secret_access_key),
                )
            return self._clients[service]

    def dynamodb_client(self):
        return self._client("dynamodb")

    def streams_client(self):
        return self._client("dynamodbstreams")

    def s3_client(self):
        return self._client("s3")

    def wal_table(self) -> WalTable:
        return WalTable(self.dynamodb_client(), self.table)

    def blob_store(self) -> BlobStore:
        return BlobStore(self.s3_client(), self.bucket, self.prefix)


def _plain(value: Any) -> str | None:
    """A secret's value: EnvVars are resolved by Dagster inside runs, but not when the CLI uses the resource."""
    if isinstance(value, dg.EnvVar):
        value = value.get_value()
    return value or None
