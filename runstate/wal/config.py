"""The dataset WAL's one frozen configuration, parsed once from the Settings (or from the Dagster
resource's fields, whose descriptions say what each value does): where the table and the blobs live,
and how the flush runs behave."""

from __future__ import annotations

from dataclasses import dataclass, field

from runstate.config import Settings


@dataclass(frozen=True)
class WalConfig:
    """Empty credentials use boto3's own chain (the environment, then the instance's role)."""

    endpoint_url: str | None = Settings.aws_endpoint_url
    region: str = Settings.aws_region
    table: str = Settings.wal_table
    bucket: str = Settings.blob_bucket
    prefix: str = Settings.blob_prefix
    max_batch_size: int = 500
    flush_shards: int = Settings.wal_flush_shards
    min_run_interval_s: float = 15.0
    flush_workers: int = 8
    flush_attempts: int = 3
    flush_retry_delay_s: float = 1.0
    stale_run_seconds: int = 900
    flush_linger_s: float = Settings.wal_flush_linger_s
    flush_always_on: bool = Settings.wal_flush_mode == "always-on"
    flush_poll_s: float = 0.5
    flush_lease_ttl_s: float = 60.0
    flush_handover_wait_s: float = 120.0
    dataset_table_copy_on_write_max_mb: int = Settings.copy_on_write_max_mb
    flush_run_budget_s: float = Settings.wal_flush_run_budget_s
    retention_days: int = 30
    aws_access_key_id: str | None = field(default=None, repr=False)
    aws_secret_access_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # An always-on run lives its budget plus the wait for its successor: under the stale bound too.
        held_s = self.flush_run_budget_s + self.flush_handover_wait_s
        if self.flush_always_on and self.stale_run_seconds and held_s >= self.stale_run_seconds / 2:
            raise ValueError(
                f"flush_run_budget_s + flush_handover_wait_s ({held_s:g}) must be under half of "
                f"stale_run_seconds ({self.stale_run_seconds}), or an always-on run would be taken for a lost one"
            )
        # A run still STARTED after stale_run_seconds is taken as lost and its plan flushed again.
        if (
            (self.flush_linger_s or self.flush_always_on)
            and self.stale_run_seconds
            and self.flush_run_budget_s >= self.stale_run_seconds / 2
        ):
            raise ValueError(
                f"flush_run_budget_s ({self.flush_run_budget_s:g}) must be under half of stale_run_seconds "
                f"({self.stale_run_seconds}), or a lingering (or always-on) flush run would be taken for a lost one"
            )

    @classmethod
    def from_settings(cls, s: Settings) -> WalConfig:
        return cls(
            endpoint_url=s.aws_endpoint_url,
            region=s.aws_region,
            table=s.wal_table,
            bucket=s.blob_bucket,
            prefix=s.blob_prefix,
            flush_shards=s.wal_flush_shards,
            flush_linger_s=s.wal_flush_linger_s,
            flush_always_on=s.wal_flush_mode == "always-on",
            flush_run_budget_s=s.wal_flush_run_budget_s,
            dataset_table_copy_on_write_max_mb=s.copy_on_write_max_mb,
        )
