"""The code location joins the pipeline up: dataset_snapshots -> dataset_tables -> the maintenance assets."""

from __future__ import annotations

import dagster as dg


def test_the_global_lineage_runs_from_the_wal_through_the_dataset_tables_into_maintenance():
    from runstate.definitions import defs

    graph = defs.resolve_asset_graph()

    assert graph.get(dg.AssetKey("dataset_tables")).parent_keys == {dg.AssetKey("dataset_snapshots")}
    assert dg.AssetKey("dataset_tables") in graph.get(dg.AssetKey("table_inventory")).parent_keys
    assert dg.AssetKey("table_inventory") in graph.get(dg.AssetKey("table_health")).parent_keys


def test_the_merge_job_sensor_and_backfill_policy_are_in_the_code_location():
    from runstate.definitions import defs

    assert defs.resolve_sensor_def("dataset_tables_sensor").job_name == "merge_dataset_tables"
    tables = defs.resolve_assets_def("dataset_tables")
    assert tables.backfill_policy.max_partitions_per_run == 25
    assert tables.partitions_def.name == "datasets"


def test_the_merge_sensor_ticks_as_often_as_configured():
    from runstate.config import Settings
    from runstate.defs.dataset_tables import build_defs

    def interval(environ: dict[str, str]) -> int | None:
        [sensor] = build_defs(Settings.from_env(environ)).sensors
        return sensor.minimum_interval_seconds

    assert interval({}) == 60
    assert interval({"RUNSTATE_DATASET_MERGE_INTERVAL_S": "10"}) == 10
