"""The dataset WAL's one frozen configuration, parsed once from the Settings (or from the Dagster
resource's fields): where the table and the blobs live, and how the flush runs behave. Each field's
metadata hold its description and its bounds (`gt`, `ge`), which the Dagster resource, whose fields are
derived from these, shows and checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from runstate.config import Settings


@dataclass(frozen=True)
class WalConfig:
    """Empty credentials use boto3's own chain (the environment, then the instance's role)."""

    endpoint_url: str | None = field(
        default=Settings.aws_endpoint_url,
        metadata={"description": "AWS endpoint (moto's server in development); empty means AWS itself."},
    )
    region: str = field(default=Settings.aws_region, metadata={"description": "AWS region."})
    table: str = field(default=Settings.wal_table, metadata={"description": "The WAL table."})
    bucket: str = field(default=Settings.blob_bucket, metadata={"description": "The blob bucket."})
    prefix: str = field(default=Settings.blob_prefix, metadata={"description": "Key prefix of every blob."})
    max_batch_size: int = field(
        default=500,
        metadata={"description": "The most WAL rows of one dataset that go into one delta blob.", "gt": 0},
    )
    flush_shards: int = field(
        default=Settings.wal_flush_shards,
        metadata={"description": "Flush shards S: at most one flush run per shard at a time.", "gt": 0},
    )
    min_run_interval_s: float = field(
        default=15.0,
        metadata={
            "description": "A shard gets a new flush run at most this often: at most 2 runs per shard "
            "per 30 s timer.",
            "ge": 0,
        },
    )
    flush_workers: int = field(
        default=8, metadata={"description": "Datasets a shard run flushes in parallel.", "gt": 0}
    )
    flush_attempts: int = field(
        default=3, metadata={"description": "Tries per dataset in a shard run before reporting it.", "gt": 0}
    )
    flush_retry_delay_s: float = field(
        default=1.0, metadata={"description": "First wait between tries (doubled each time).", "ge": 0}
    )
    stale_run_seconds: int = field(
        default=900,
        metadata={
            "description": "A flush run still STARTED after this long is taken as lost: its batch is planned "
            "again. Also set as the run's dagster/max_runtime so run monitoring fails it at the same moment.",
            "ge": 0,
        },
    )
    flush_linger_s: float = field(
        default=Settings.wal_flush_linger_s,
        metadata={
            "description": "After its plan, a flush run keeps flushing its shard's new rows until none has come "
            "for this long (saves a run start per row; RUNSTATE_WAL_FLUSH_LINGER_S). 0: no linger.",
            "ge": 0,
        },
    )
    flush_always_on: bool = field(
        default=Settings.wal_flush_mode == "always-on",
        metadata={
            "description": "Each flush shard keeps one live run that polls its shard and hands over to its "
            "successor at flush_run_budget_s (RUNSTATE_WAL_FLUSH_MODE=always-on); off: a run per shard with "
            "work, lingering flush_linger_s."
        },
    )
    flush_poll_s: float = field(
        default=0.5, metadata={"description": "An always-on run looks at its shard this often.", "gt": 0}
    )
    flush_lease_ttl_s: float = field(
        default=60.0,
        metadata={
            "description": "A shard's lease expires this long after its holder's last renewal (a run found "
            "dead loses it at once). Longer than the slowest flush round.",
            "gt": 0,
        },
    )
    flush_handover_wait_s: float = field(
        default=120.0,
        metadata={
            "description": "An always-on run past its budget waits this long for its successor, flushing, "
            "then lets the shard go (wal_sensor starts a new run).",
            "ge": 0,
        },
    )
    dataset_table_copy_on_write_max_mb: int = field(
        default=Settings.copy_on_write_max_mb,
        metadata={
            "description": "A dataset table merges copy-on-write up to this many MB of files, merge-on-read "
            "above (RUNSTATE_COPY_ON_WRITE_MAX_MB). 0: always merge-on-read.",
            "ge": 0,
        },
    )
    flush_run_budget_s: float = field(
        default=Settings.wal_flush_run_budget_s,
        metadata={
            "description": "A lingering flush run takes no new rows after this long: runs stay short-lived.",
            "ge": 0,
        },
    )
    retention_days: int = field(
        default=30, metadata={"description": "Compaction trims Applied WAL rows older than this.", "ge": 0}
    )
    aws_access_key_id: str | None = field(
        default=None, repr=False, metadata={"description": "Pass as dg.EnvVar; empty uses boto3's chain."}
    )
    aws_secret_access_key: str | None = field(
        default=None, repr=False, metadata={"description": "Pass as dg.EnvVar; empty uses boto3's chain."}
    )

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
