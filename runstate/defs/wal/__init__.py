"""Dagster definitions for the dataset WAL: sensor -> flush_wal runs, compaction, snapshots, lag check."""

from __future__ import annotations

import dagster as dg

from runstate.defs.resources import wal_resource
from runstate.defs.wal.assets import dataset_snapshots
from runstate.defs.wal.checks import wal_lag, wal_lag_job
from runstate.defs.wal.jobs import compact_wal, flush_wal
from runstate.defs.wal.resources import WalResource
from runstate.defs.wal.schedules import wal_compaction_schedule
from runstate.defs.wal.sensors import wal_sensor


def build_defs(wal: WalResource | None = None, flush_job: dg.JobDefinition | None = None) -> dg.Definitions:
    """The WAL domain's definitions; tests pass a WalResource of their own table and bucket."""
    return dg.Definitions(
        assets=[dataset_snapshots],
        asset_checks=[wal_lag],
        jobs=[flush_job or flush_wal, compact_wal, wal_lag_job],
        sensors=[wal_sensor],
        schedules=[wal_compaction_schedule],
        resources={"wal": wal or wal_resource()},
    )


defs = build_defs()
