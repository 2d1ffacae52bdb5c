"""runstate_instance_check: a storage-only instance gets a warning for each missing setting, saying what to
add; adding exactly that leaves nothing missing; the project's own dagster.yaml lacks nothing (its pool limit
aside, which `db upgrade` sets: runstate_tests/test_dagster_instance.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from runstate.defs.instance.checks import CHECK_INTERVAL_S, missing_bounds, report, runstate_instance_check
from runstate_tests.defs.instance_homes import storage_only_config, write_home

BIN = str(Path(sys.executable).parent)  # where `dagster` is, as on a user's PATH
# How soon after a daemon start the check must tick, and how long a stale message may last.
PROMPT_S = 30
STORAGE_ONLY_MISSING = [
    "a limit for the pool runstate_spark",
    "one in-progress run per value of runstate/wal_shard, runstate/merge_shard, runstate/table in the run queue",
    "run monitoring",
    "run retries",
    "the run launcher's health check",
    "threads for the sensor daemon",
]


@pytest.fixture
def home(tmp_path: Path, fresh_database: str) -> Path:
    return write_home(tmp_path / "home", storage_only_config(fresh_database))


def test_a_storage_only_instance_lacks_each_setting_the_code_location_names(home):
    with dg.DagsterInstance.from_config(str(home)) as instance:
        missing = missing_bounds(instance)

    assert [bound.name for bound in missing] == STORAGE_ONLY_MISSING


def test_automation_and_freshness_turned_off_are_named_too(tmp_path, fresh_database):
    config = storage_only_config(fresh_database)
    config.update(auto_materialize={"use_sensors": False}, freshness={"enabled": False})
    with dg.DagsterInstance.from_config(str(write_home(tmp_path, config))) as instance:
        names = [bound.name for bound in missing_bounds(instance)]

    assert names[-2:] == ["automation sensors", "the freshness daemon"]


def test_the_sensor_says_it_on_its_tick_and_in_its_log(home, capfd):
    with dg.DagsterInstance.from_config(str(home)) as instance:
        result = runstate_instance_check(dg.build_sensor_context(instance=instance))

    assert isinstance(result, dg.SkipReason)
    assert result.skip_message.startswith("runstate: 6 setting(s) missing from this Dagster instance")
    assert "add these lines to dagster.yaml:\nrun_retries:\n  enabled: true\n  max_retries: 3\n\n" in (
        result.skip_message
    )
    assert "run `dagster instance concurrency set runstate_spark 2`" in result.skip_message
    logged = [line for line in capfd.readouterr().err.splitlines() if " - dagster - WARNING - " in line]
    assert len(logged) == 6 and "run retries: a run that fails to launch" in logged[3], logged


def test_adding_exactly_what_it_says_leaves_nothing_missing(home, fresh_database):
    with dg.DagsterInstance.from_config(str(home)) as instance:
        missing = missing_bounds(instance)
    config = storage_only_config(fresh_database)
    for bound in missing:
        assert not set(bound.dagster_yaml) & set(config), bound  # each adds sections of its own
        config.update(bound.dagster_yaml)
    write_home(home, config)
    commands = [bound.command for bound in missing if bound.command]
    for command in commands:  # as a user types it, against this home
        env = {**os.environ, "DAGSTER_HOME": str(home), "PATH": f"{BIN}:{os.environ['PATH']}"}
        done = subprocess.run(command.split(), env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]

    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert missing_bounds(instance) == []
    assert commands == ["dagster instance concurrency set runstate_spark 2"]


def test_the_printed_lines_pasted_into_dagster_yaml_as_they_are_start_the_instance(home):
    """Each block the check prints goes below a storage-only dagster.yaml, as a user pastes it; the
    instance starts and has each setting (before, a one-line `{run_retries: {...}}` stopped it)."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        printed = runstate_instance_check(dg.build_sensor_context(instance=instance)).skip_message
    blocks = [item.split("\n", 1)[1] for item in printed.split("\n\n")[1:] if "\n" in item]
    dagster_yaml = home / "dagster.yaml"
    dagster_yaml.write_text(dagster_yaml.read_text() + "".join(f"{block}\n" for block in blocks))

    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs(limit=1)  # its storage answers
        assert [bound.name for bound in missing_bounds(instance)] == [STORAGE_ONLY_MISSING[0]]
        assert instance.get_settings("sensors") == {"use_threads": True, "num_workers": 4}
    assert len(blocks) == len(STORAGE_ONLY_MISSING) - 1  # all but the pool limit, a command


@pytest.mark.parametrize("sensors, named", [({"use_threads": False}, True), ({"use_threads": True}, False)])
def test_a_sensor_daemon_without_threads_is_named(tmp_path, fresh_database, sensors, named):
    config = {**storage_only_config(fresh_database), "sensors": sensors}
    with dg.DagsterInstance.from_config(str(write_home(tmp_path, config))) as instance:
        missing = missing_bounds(instance)

    assert ("threads for the sensor daemon" in [bound.name for bound in missing]) is named
    assert ("sensors:\n  use_threads: true\n  num_workers: 4" in report(missing)) is named


def test_the_check_ticks_soon_after_a_daemon_start_and_after_settings_change():
    """The daemon ticks a sensor once its interval has passed since the last tick, across restarts: the
    first check after a start came up to 5 minutes later, and the UI kept the old message as long."""
    assert runstate_instance_check.minimum_interval_seconds == CHECK_INTERVAL_S <= PROMPT_S


def test_after_a_daemon_restart_the_check_ticks_within_its_interval_and_drops_a_stale_message(home, tmp_path):
    """The real sensor daemon's iteration, as after a restart (a new workspace, the last tick in storage):
    it ticks the check again PROMPT_S later (before: 5 minutes), and the new tick no
    longer names a setting added meanwhile (the pool limit, which lives in the instance's storage)."""
    from dagster._core.scheduler.instigation import InstigatorType
    from dagster._core.test_utils import create_test_daemon_workspace_context
    from dagster._core.workspace.load_target import PythonFileTarget
    from dagster._daemon.daemon import get_default_daemon_logger
    from dagster._daemon.sensor import execute_sensor_iteration

    from runstate.defs.pool import set_spark_pool_limit

    location = tmp_path / "location.py"
    location.write_text(
        "import dagster as dg\n"
        "from runstate.defs.instance.checks import runstate_instance_check\n"
        "defs = dg.Definitions(sensors=[runstate_instance_check])\n"
    )
    target = PythonFileTarget(str(location), "defs", str(tmp_path), "check")

    def daemon_start(instance: dg.DagsterInstance) -> list[str]:
        """One sensor daemon iteration in a new workspace; every skip message so far, newest first."""
        with create_test_daemon_workspace_context(target, instance) as workspace:
            list(execute_sensor_iteration(workspace, get_default_daemon_logger("SensorDaemon"), None, None))
        states = instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
        (state,) = [s for s in states if s.name == "runstate_instance_check"]
        return [
            tick.skip_reason or ""
            for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id)
        ]

    with dg.DagsterInstance.from_config(str(home)) as instance:
        first = daemon_start(instance)
        set_spark_pool_limit(instance, 2)
        time.sleep(PROMPT_S + 1)  # not CHECK_INTERVAL_S: the bound the check must keep
        after = daemon_start(instance)

    assert len(first) == 1 and STORAGE_ONLY_MISSING[0] in first[0]
    assert len(after) == 2 and after[0].startswith("runstate: 5 setting(s) missing")
    assert STORAGE_ONLY_MISSING[0] not in after[0]
