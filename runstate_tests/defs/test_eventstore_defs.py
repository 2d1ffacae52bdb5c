"""The eventstore code location loads, and its resource is chosen and validated by configuration."""

from __future__ import annotations

import dagster as dg
import pytest

from runstate.config import Settings
from runstate.defs.eventstore import defs
from runstate.defs.eventstore.resources import EventStoreResource
from runstate.defs.resources import event_store_resource
from runstate.eventstore import EventStoreError


def test_eventstore_definitions_load_with_their_jobs_schedule_sensor_and_resource():
    dg.Definitions.validate_loadable(defs)

    assert {job.name for job in defs.resolve_all_job_defs()} >= {
        "append_events",
        "archive_events",
        "run_snapshots_job",
    }
    assert defs.resolve_schedule_def("archive_events_schedule").cron_schedule == "40 3 * * *"
    assert defs.resolve_sensor_def("run_snapshots_sensor").job_name == "run_snapshots_job"
    assert isinstance(defs.resources["event_store"], EventStoreResource)


def test_settings_pick_the_snowflake_backend_through_snowflake_resource():
    s = Settings.from_env(
        {
            "RUNSTATE_EVENTSTORE": "snowflake",
            "SNOWFLAKE_ACCOUNT": "acme",
            "SNOWFLAKE_USER": "loader",
            "SNOWFLAKE_PASSWORD": "pw",
            "SNOWFLAKE_HOST": "127.0.0.1",
            "SNOWFLAKE_PORT": "8123",
            "SNOWFLAKE_PROTOCOL": "http",
            "SNOWFLAKE_SCHEMA": "runs",
        }
    )

    resource = event_store_resource(s)

    assert resource.backend == "snowflake" and resource.snowflake_schema == "RUNS"
    assert (
        resource.snowflake.port == 8123
        and resource.config().snowflake.connect_kwargs()["host"] == "127.0.0.1"
    )


def test_loading_the_code_location_imports_no_heavy_driver():
    """Run workers start faster when the Snowflake connector, pyspark and pyarrow load on first use."""
    import subprocess
    import sys

    probe = (
        "import sys, runstate.definitions; "
        "print(sorted(m for m in ('snowflake.connector', 'pyspark', 'pyarrow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)

    assert out.returncode == 0, out.stderr[-2000:]
    assert "snowflake.connector" not in out.stdout


def test_an_unknown_backend_is_rejected_by_name():
    with pytest.raises(Exception, match="backend must be one of"):
        EventStoreResource(backend="mysql")


def test_the_snowflake_backend_without_a_connection_says_what_is_missing():
    with pytest.raises(
        EventStoreError, match="needs SNOWFLAKE_ACCOUNT .* or the event_store resource's `snowflake`"
    ):
        EventStoreResource(backend="snowflake").get_store()
