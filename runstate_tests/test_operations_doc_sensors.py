"""docs/OPERATIONS.md's list of the sensors on by default is the code location's (issue 51.6: it left out
dataset_tables_sensor, run_liveness and run_history_sensor)."""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg

from runstate.definitions import defs

OPERATIONS = (Path(__file__).resolve().parent.parent / "docs" / "OPERATIONS.md").read_text()


def test_the_documented_sensors_on_by_default_are_those_whose_default_status_is_running():
    sensors = defs.get_repository_def().sensor_defs
    running = {s.name for s in sensors if s.default_status == dg.DefaultSensorStatus.RUNNING}
    # The list runs from its opening words to the schedules; it also names jobs, assets and stopped sensors.
    listed = OPERATIONS.split("- The sensors on by default:", 1)[1].split("Off by default:", 1)[0]
    documented = set(re.findall(r"`([a-z_]+)`", listed)) & {s.name for s in sensors}

    assert documented == running
