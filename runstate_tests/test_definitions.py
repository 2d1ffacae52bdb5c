"""The whole code location loads, with every asset, check, job, sensor and schedule the issues name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

from runstate.definitions import defs

ROOT = Path(__file__).resolve().parent.parent

ASSETS = {"run_snapshots", "dataset_snapshots", "table_health", "table_inventory"}
JOBS = {"append_events", "flush_wal", "iceberg_maintenance", "submit_maintenance"}
SENSORS = {"wal_sensor", "maintenance_queue_sensor", "run_recorder"}
SCHEDULES = {"maintenance_orchestrator"}
CHECKS = {"table_is_healthy"}


def test_definitions_resolve_with_every_named_definition():
    repo = defs.get_repository_def()
    asset_names = {key.to_user_string() for key in repo.asset_graph.get_all_asset_keys()}
    assert ASSETS <= asset_names
    assert JOBS <= {job.name for job in repo.get_all_jobs()}
    assert SENSORS <= {sensor.name for sensor in repo.sensor_defs}
    assert SCHEDULES <= {schedule.name for schedule in repo.schedule_defs}
    check_names = {key.name for key in repo.asset_graph.asset_check_keys}
    assert CHECKS <= check_names


def test_core_packages_never_import_dagster():
    code = (
        "import sys, runstate.eventstore, runstate.wal, runstate.maintenance; "
        "sys.exit(1 if any(m == 'dagster' or m.startswith('dagster.') for m in sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_dagster_definitions_validate_passes(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}  # an empty home: validation needs no storage
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_job_has_a_description_for_the_launchpad():
    for job in defs.get_repository_def().get_all_jobs():
        if not job.name.startswith("__"):
            assert job.description, f"job {job.name} has no description"
