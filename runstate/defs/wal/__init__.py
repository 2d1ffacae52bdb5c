"""Dagster definitions for the dataset WAL: sensor -> flush_wal runs, compaction, snapshots, lag check."""

from __future__ import annotations

import os

import dagster as dg

from runstate.defs.wal.assets import dataset_snapshots
from runstate.defs.wal.checks import wal_lag, wal_lag_job
from runstate.defs.wal.jobs import compact_wal, flush_wal
from runstate.defs.wal.resources import WalResource
from runstate.defs.wal.schedules import wal_compaction_schedule, wal_lag_schedule
from runstate.defs.wal.sensors import wal_sensor


def _secret(name: str) -> dg.EnvVar | None:
    """An EnvVar when the variable is set; otherwise None so boto3's own credential chain applies."""
    return dg.EnvVar(name) if os.environ.get(name) else None


def wal_resource(**overrides: object) -> WalResource:
    """The deployment's WalResource: endpoint, table, bucket and prefix follow the runstate settings."""
    config: dict[str, object] = {
        "aws_access_key_id": _secret("AWS_ACCESS_KEY_ID"),
        "aws_secret_access_key": _secret("AWS_SECRET_ACCESS_KEY"),
    }
    config.update(overrides)
    return WalResource(**config)


def build_defs(wal: WalResource | None = None, flush_job: dg.JobDefinition | None = None) -> dg.Definitions:
    """The WAL domain's definitions; tests pass a WalResource of their own table and bucket."""
    return dg.Definitions(
        assets=[dataset_snapshots],
        asset_checks=[wal_lag],
        jobs=[flush_job or flush_wal, compact_wal, wal_lag_job],
        sensors=[wal_sensor],
        schedules=[wal_compaction_schedule, wal_lag_schedule],
        resources={"wal": wal or wal_resource()},
    )


defs = build_defs()
