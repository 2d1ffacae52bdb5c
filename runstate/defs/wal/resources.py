"""`WalResource` (resource key `wal`): where the WAL table and the blob bucket live, plus lazy boto3 clients."""

from __future__ import annotations

import threading
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr, model_validator

from runstate import wiring
from runstate.defs.config_fields import config_of
from runstate.wal import BlobStore, WalTable
from runstate.wal.config import WalConfig


class WalResource(dg.ConfigurableResource):
    """The dataset WAL's AWS side: a DynamoDB table with a stream, and an S3 bucket for blobs.

    Configuration only: the fields of `WalConfig` (its defaults, theirs); the deployment's values come
    from `runstate.defs.resources.wal_resource()`. Clients are created on first use, through
    `runstate.wiring`, never at import or definition time.
    """

    endpoint_url: str | None = Field(
        default=WalConfig.endpoint_url,
        description="AWS endpoint (moto's server in development); empty means AWS itself.",
    )
    region: str = Field(default=WalConfig.region, description="AWS region.")
    table: str = Field(default=WalConfig.table, description="The WAL table.")
    bucket: str = Field(default=WalConfig.bucket, description="The blob bucket.")
    prefix: str = Field(default=WalConfig.prefix, description="Key prefix of every blob.")
    max_batch_size: int = Field(
        default=WalConfig.max_batch_size,
        gt=0,
        description="The most WAL rows of one dataset that go into one delta blob.",
    )
    flush_shards: int = Field(
        default=WalConfig.flush_shards,
        gt=0,
        description="Flush shards S: at most one flush run per shard at a time.",
    )
    min_run_interval_s: float = Field(
        default=WalConfig.min_run_interval_s,
        ge=0,
        description="A shard gets a new flush run at most this often: at most 2 runs per shard per 30 s timer.",
    )
    flush_workers: int = Field(
        default=WalConfig.flush_workers, gt=0, description="Datasets a shard run flushes in parallel."
    )
    flush_attempts: int = Field(
        default=WalConfig.flush_attempts,
        gt=0,
        description="Tries per dataset in a shard run before reporting it.",
    )
    flush_retry_delay_s: float = Field(
        default=WalConfig.flush_retry_delay_s,
        ge=0,
        description="First wait between tries (doubled each time).",
    )
    stale_run_seconds: int = Field(
        default=WalConfig.stale_run_seconds,
        ge=0,
        description="A flush run still STARTED after this long is taken as lost: its batch is planned again. "
        "Also set as the run's dagster/max_runtime so run monitoring fails it at the same moment.",
    )
    flush_linger_s: float = Field(
        default=WalConfig.flush_linger_s,
        ge=0,
        description="After its plan, a flush run keeps flushing its shard's new rows until none has come for "
        "this long (saves a run start per row; RUNSTATE_WAL_FLUSH_LINGER_S). 0: no linger.",
    )
    flush_always_on: bool = Field(
        default=WalConfig.flush_always_on,
        description="Each flush shard keeps one live run that polls its shard and hands over to its "
        "successor at flush_run_budget_s (RUNSTATE_WAL_FLUSH_MODE=always-on); off: a run per shard with "
        "work, lingering flush_linger_s.",
    )
    flush_poll_s: float = Field(
        default=WalConfig.flush_poll_s, gt=0, description="An always-on run looks at its shard this often."
    )
    flush_lease_ttl_s: float = Field(
        default=WalConfig.flush_lease_ttl_s,
        gt=0,
        description="A shard's lease expires this long after its holder's last renewal (a run found dead "
        "loses it at once). Longer than the slowest flush round.",
    )
    flush_handover_wait_s: float = Field(
        default=WalConfig.flush_handover_wait_s,
        ge=0,
        description="An always-on run past its budget waits this long for its successor, flushing, then "
        "lets the shard go (wal_sensor starts a new run).",
    )
    dataset_table_copy_on_write_max_mb: int = Field(
        default=WalConfig.dataset_table_copy_on_write_max_mb,
        ge=0,
        description="A dataset table merges copy-on-write up to this many MB of files, merge-on-read above "
        "(RUNSTATE_COPY_ON_WRITE_MAX_MB). 0: always merge-on-read.",
    )
    flush_run_budget_s: float = Field(
        default=WalConfig.flush_run_budget_s,
        ge=0,
        description="A lingering flush run takes no new rows after this long: runs stay short-lived.",
    )
    retention_days: int = Field(
        default=WalConfig.retention_days,
        ge=0,
        description="Compaction trims Applied WAL rows older than this.",
    )
    aws_access_key_id: str | None = Field(
        default=WalConfig.aws_access_key_id, description="Pass as dg.EnvVar; empty uses boto3's chain."
    )
    aws_secret_access_key: str | None = Field(
        default=WalConfig.aws_secret_access_key, description="Pass as dg.EnvVar; empty uses boto3's chain."
    )

    @model_validator(mode="after")
    def _a_valid_config(self) -> WalResource:
        self.config()  # WalConfig's rules (a ValueError names the fields)
        return self

    _clients: dict = PrivateAttr(default_factory=dict)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def config(self) -> WalConfig:
        return config_of(self, WalConfig)

    def _client(self, service: str) -> Any:
        with self._lock:
            if service not in self._clients:
                self._clients[service] = wiring.aws_client(service, self.config())
            return self._clients[service]

    def dynamodb_client(self):
        return self._client("dynamodb")

    def streams_client(self):
        return self._client("dynamodbstreams")

    def s3_client(self):
        return self._client("s3")

    def wal_table(self) -> WalTable:
        return wiring.wal_table(self.config(), self.dynamodb_client())

    def blob_store(self) -> BlobStore:
        return wiring.blob_store(self.config(), self.s3_client())
