"""`WalResource` (resource key `wal`): where the WAL table and the blob bucket live, plus lazy boto3 clients."""

from __future__ import annotations

import threading
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from runstate.config import settings
from runstate.wal import BlobStore, WalTable
from runstate.wal.clients import aws_client


class WalResource(dg.ConfigurableResource):
    """The dataset WAL's AWS side: a DynamoDB table with a stream, and an S3 bucket for blobs.

    Fields left empty take their value from the runstate settings (environment) when first used,
    so one code location follows `RUNSTATE_AWS_ENDPOINT_URL`, `RUNSTATE_WAL_TABLE`, ... without
    being rebuilt. Clients are created on first use, never at import or definition time.
    """

    endpoint_url: str | None = Field(
        default=None,
        description="AWS endpoint (moto's server by default); empty means RUNSTATE_AWS_ENDPOINT_URL, then AWS itself.",
    )
    region: str | None = Field(
        default=None, description="AWS region; empty means AWS_DEFAULT_REGION or us-east-1."
    )
    table: str | None = Field(default=None, description="The WAL table; empty means RUNSTATE_WAL_TABLE.")
    bucket: str | None = Field(default=None, description="The blob bucket; empty means RUNSTATE_BLOB_BUCKET.")
    prefix: str | None = Field(
        default=None, description="Key prefix of every blob; empty means RUNSTATE_BLOB_PREFIX."
    )
    max_batch_size: int = Field(
        default=500, gt=0, description="The most WAL rows of one dataset that go into one delta blob."
    )
    flush_shards: int | None = Field(
        default=None,
        gt=0,
        description="Flush shards S: at most one flush run per shard at a time; empty means RUNSTATE_WAL_FLUSH_SHARDS.",
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
    retention_days: int = Field(
        default=30, ge=0, description="Compaction trims Applied WAL rows older than this."
    )
    aws_access_key_id: str | None = Field(
        default=None, description="Pass as dg.EnvVar; empty uses boto3's chain."
    )
    aws_secret_access_key: str | None = Field(
        default=None, description="Pass as dg.EnvVar; empty uses boto3's chain."
    )

    _clients: dict = PrivateAttr(default_factory=dict)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    # Resolved settings: explicit config wins, then the environment.
    @property
    def table_name(self) -> str:
        return self.table or settings().wal_table

    @property
    def bucket_name(self) -> str:
        return self.bucket or settings().blob_bucket

    @property
    def blob_prefix(self) -> str:
        return self.prefix if self.prefix is not None else settings().blob_prefix

    @property
    def shards(self) -> int:
        return self.flush_shards or settings().wal_flush_shards

    @property
    def resolved_endpoint_url(self) -> str | None:
        return self.endpoint_url or settings().aws_endpoint_url

    @property
    def resolved_region(self) -> str:
        return self.region or settings().aws_region

    def _client(self, service: str) -> Any:
        with self._lock:
            if service not in self._clients:
                self._clients[service] = aws_client(
                    service,
                    endpoint_url=self.resolved_endpoint_url,
                    region=self.resolved_region,
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
        return WalTable(self.dynamodb_client(), self.table_name)

    def blob_store(self) -> BlobStore:
        return BlobStore(self.s3_client(), self.bucket_name, self.blob_prefix)


def _plain(value: Any) -> str | None:
    """A secret's value: EnvVars are resolved by Dagster inside runs, but not when the CLI uses the resource."""
    if isinstance(value, dg.EnvVar):
        value = value.get_value()
    return value or None
