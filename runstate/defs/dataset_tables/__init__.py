"""Dagster definitions for the dataset tables: the `dataset_tables` asset (rebuild and backfill), the
merge job run per shard, and the sensor that requests it after flushes. `wal` and `spark` are shared."""

from __future__ import annotations

import warnings

import dagster as dg

from runstate.config import Settings, settings
from runstate.defs.dataset_tables.assets import dataset_tables, tables_freshness
from runstate.defs.dataset_tables.jobs import merge_dataset_tables
from runstate.defs.dataset_tables.sensors import build_dataset_tables_sensor

# The maintenance service reads every table of the catalog, dataset tables included: the lineage says so.
CATALOG_ASSET = "table_inventory"


def build_defs(s: Settings | None = None) -> dg.Definitions:
    """The domain's definitions; the `wal` and `spark` resources come from the WAL and shared definitions."""
    interval = (s or settings()).dataset_merge_interval_s
    tables = dataset_tables.map_asset_specs(
        lambda spec: spec.replace_attributes(freshness_policy=tables_freshness(interval))
    )
    return dg.Definitions(
        assets=[tables], jobs=[merge_dataset_tables], sensors=[build_dataset_tables_sensor(interval)]
    )


def link_to_maintenance(defs: dg.Definitions) -> dg.Definitions:
    """`table_inventory` (maintenance) downstream of `dataset_tables`, so the global lineage reads
    dataset_snapshots -> dataset_tables -> the maintenance assets."""
    # map_resolved_asset_specs is marked preview in dagster 1.13; the alternative is the same dep written
    # into the maintenance asset itself. The call only adds a dependency edge.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        warnings.simplefilter("ignore", dg.BetaWarning)
        return defs.map_resolved_asset_specs(
            func=lambda spec: spec.merge_attributes(deps=[dataset_tables]), selection=CATALOG_ASSET
        )


defs = build_defs()
