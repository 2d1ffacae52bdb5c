"""The run_snapshots asset, its day partitions, backfills and its sensor, through real Postgres."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import dagster as dg
import psycopg
import pytest
from psycopg import sql

from runstate.commands.ticking import tick_sensor
from runstate.defs.eventstore.assets import EXPORT_JOB, run_events, run_snapshots, run_snapshots_job
from runstate.defs.eventstore.sensors import run_snapshots_sensor
from runstate.eventstore import NewEvent


@dataclass(frozen=True)
class Days:
    today: datetime
    yesterday: datetime
    today_key: str
    yesterday_key: str


@pytest.fixture
def days() -> Days:
    """Today and yesterday as of this test, not as of the collection: the sensor reads the clock, and a
    suite that ran across a UTC midnight saw it judge "today" a day later than module constants did. A
    test that would start in the last half-minute of a day waits for the next one."""
    now = datetime.now(UTC)
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    before_midnight = (today + timedelta(days=1) - now).total_seconds()
    if before_midnight < 30:
        time.sleep(before_midnight + 1)
        today += timedelta(days=1)
    yesterday = today - timedelta(days=1)
    return Days(today, yesterday, today.strftime("%Y-%m-%d"), yesterday.strftime("%Y-%m-%d"))


@pytest.fixture
def runs(store, days) -> dict[str, datetime]:
    """Runs a and b started today, c yesterday; each has a step in progress."""
    started = {
        "a": days.today + timedelta(minutes=1),
        "b": days.today + timedelta(minutes=2),
        "c": days.yesterday + timedelta(hours=3),
    }
    for run_id, at in started.items():
        store.append_batch(
            run_id,
            [
                NewEvent(run_id, "RunStarted", at),
                NewEvent(run_id, "StepStarted", at + timedelta(seconds=1), step_id="load"),
            ],
        )
    return started


def materialize_day(resource, day: str, **kwargs) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [run_events, run_snapshots], partition_key=day, resources={"event_store": resource}, **kwargs
    )


def metadata(result: dg.ExecuteInProcessResult) -> dict:
    """The run_snapshots materialization's metadata (a range run repeats the window's totals per day)."""
    materialization, *_ = [
        e.event_specific_data.materialization
        for e in result.get_asset_materialization_events()
        if e.event_specific_data.materialization.asset_key == dg.AssetKey("run_snapshots")
    ]
    return {key: value.value for key, value in materialization.metadata.items()}


def test_materializing_a_day_projects_the_runs_started_that_day(resource, store, runs, days):
    result = materialize_day(resource, days.today_key)

    assert result.success
    meta = metadata(result)
    assert meta["mode"] == "incremental"
    assert meta["runs_projected"] == 2
    assert meta["runs_changed"] == 2
    assert meta["events_applied"] == 4
    assert set(store.stale_runs()) == {"c"}
    assert store.project("a").steps["load"].status == "RUNNING"


def test_a_second_materialization_without_new_events_moves_nothing(resource, store, runs, days):
    materialize_day(resource, days.today_key)
    versions = {run_id: store.project(run_id).version for run_id in ("a", "b")}

    meta = metadata(materialize_day(resource, days.today_key))

    assert meta["runs_changed"] == 0 and meta["events_applied"] == 0
    assert {run_id: store.project(run_id).version for run_id in ("a", "b")} == versions


def test_new_events_are_applied_incrementally(resource, store, runs, days):
    materialize_day(resource, days.today_key)
    store.append(NewEvent("a", "StepCompleted", runs["a"] + timedelta(minutes=1), step_id="load"))

    meta = metadata(materialize_day(resource, days.today_key))

    assert meta["runs_changed"] == 1 and meta["events_applied"] == 1
    assert store.project("a").steps["load"].status == "SUCCESS"


def test_a_backfill_run_rebuilds_the_day_from_scratch(resource, store, runs, pg_database, pg_schema, days):
    materialize_day(resource, days.today_key)
    incremental = store.project("a")
    tamper_projection(pg_database, pg_schema, "a")

    result = materialize_day(resource, days.today_key, tags={"dagster/backfill": "bf-test"})

    assert metadata(result)["mode"] == "rebuild"
    assert store.project("a").same_state(incremental)


def test_rebuild_config_forces_a_rebuild_outside_a_backfill(
    resource, store, runs, pg_database, pg_schema, days
):
    materialize_day(resource, days.today_key)
    incremental = store.project("b")
    tamper_projection(pg_database, pg_schema, "b")

    result = materialize_day(
        resource, days.today_key, run_config={"ops": {"run_snapshots": {"config": {"rebuild": True}}}}
    )

    assert metadata(result)["mode"] == "rebuild"
    assert store.project("b").same_state(incremental)


def test_a_multi_day_backfill_rebuilds_its_whole_window_in_one_run(resource, store, runs, days):
    defs = dg.Definitions(
        assets=[run_events, run_snapshots], jobs=[run_snapshots_job], resources={"event_store": resource}
    )
    job = defs.resolve_job_def("run_snapshots_job")

    result = job.execute_in_process(
        tags={
            "dagster/asset_partition_range_start": days.yesterday_key,
            "dagster/asset_partition_range_end": days.today_key,
            "dagster/backfill": "bf-range",
        }
    )

    assert result.success
    assert len(result.get_asset_materialization_events()) == 2
    meta = metadata(result)
    assert meta["mode"] == "rebuild" and meta["runs_projected"] == 3
    assert store.stale_runs() == []


def sensor_defs(resource) -> dg.Definitions:
    """run_snapshots, its job and its sensor on the test's store."""
    return dg.Definitions(
        assets=[run_events, run_snapshots],
        jobs=[run_snapshots_job],
        sensors=[run_snapshots_sensor],
        resources={"event_store": resource},
    )


def test_sensor_requests_the_start_days_of_runs_with_new_events(resource, store, runs, days):
    defs = sensor_defs(resource)
    instance = dg.DagsterInstance.ephemeral()

    first = tick_sensor("run_snapshots_sensor", defs=defs, instance=instance)
    idle = tick_sensor("run_snapshots_sensor", defs=defs, instance=instance)
    store.append(
        NewEvent("c", "StepFailed", runs["c"] + timedelta(minutes=9), step_id="load", data={"error": "boom"})
    )
    after_new_event = tick_sensor("run_snapshots_sensor", defs=defs, instance=instance)

    assert sorted(r.dagster_run.tags["dagster/partition"] for r in first.results) == [
        days.yesterday_key,
        days.today_key,
    ]
    assert first.failed == 0
    assert idle.requested == 0 and idle.skip_reason
    assert [r.dagster_run.tags["dagster/partition"] for r in after_new_event.results] == [days.yesterday_key]
    assert store.project("c").steps["load"].status == "FAILED"
    assert store.stale_runs() == []


def test_sensor_run_keys_are_stable_until_new_events_arrive(resource, store, runs):
    instance = dg.DagsterInstance.ephemeral()  # the sensor looks up which stale runs are its own

    def run_keys() -> list[str]:
        with dg.build_sensor_context(resources={"event_store": resource}, instance=instance) as context:
            return sorted(r.run_key for r in run_snapshots_sensor(context))

    before = run_keys()
    again = run_keys()
    store.append(NewEvent("a", "StepCompleted", runs["a"] + timedelta(minutes=1), step_id="load"))
    after = run_keys()

    assert before == again and len(before) == 2
    assert after != before


def tamper_projection(dsn: str, schema: str, run_id: str) -> None:
    """Simulate a projection that drifted (a projector bug): the stored status is wrong."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {}.run_snapshots SET status = 'CANCELLED',"
                " snapshot_data = jsonb_set(snapshot_data, '{{status}}', '\"CANCELLED\"') WHERE run_id = %s"
            ).format(sql.Identifier(schema)),
            (run_id,),
        )


def test_the_sensors_own_projection_runs_alone_request_nothing(resource, store, runs, days):
    """The run recorder records each run_snapshots_job run in the store; projecting that run at once would
    record another, one run a minute for ever. It waits for another stale run of its day."""
    defs = sensor_defs(resource)
    instance = dg.DagsterInstance.ephemeral()
    tick_sensor("run_snapshots_sensor", defs=defs, instance=instance)
    projection = instance.get_runs(dg.RunsFilter(job_name=run_snapshots_job.name))[0]
    store.append(NewEvent(projection.run_id, "RunStarted", runs["a"] + timedelta(minutes=1)))

    own_only = tick_sensor("run_snapshots_sensor", defs=defs, instance=instance)
    store.append(NewEvent("a", "StepCompleted", runs["a"] + timedelta(minutes=2), step_id="load"))
    with_another = tick_sensor("run_snapshots_sensor", defs=defs, instance=instance)

    assert own_only.requested == 0
    assert own_only.skip_reason == ("no run has events newer than its projection but 1 bookkeeping run(s)")
    assert [r.dagster_run.tags["dagster/partition"] for r in with_another.results] == [days.today_key]
    assert store.stale_runs() == []  # the projection run was projected with the other run of its day


def a_stale_export_run(defs: dg.Definitions, instance: dg.DagsterInstance, store, started_at: datetime):
    """Every stale run projected, then an export run that started at `started_at`. Only the job's name
    matters to the sensor: a job of that name stands in for the export's."""
    tick_sensor("run_snapshots_sensor", defs=defs, instance=instance)
    export = instance.create_run_for_job(dg.JobDefinition(name=EXPORT_JOB, graph_def=dg.GraphDefinition("g")))
    store.append(NewEvent(export.run_id, "RunStarted", started_at))
    return export


def test_a_stale_export_run_alone_requests_no_projection(resource, store, runs):
    defs, instance = sensor_defs(resource), dg.DagsterInstance.ephemeral()
    a_stale_export_run(defs, instance, store, runs["a"] + timedelta(minutes=1))

    tick = tick_sensor("run_snapshots_sensor", defs=defs, instance=instance)

    assert tick.requested == 0 and tick.skip_reason.endswith("but 1 bookkeeping run(s)")


def test_bookkeeping_runs_alone_are_projected_once_their_day_is_over(resource, store, runs, days):
    """Left stale for ever, a day of them a week would fill the window of stale runs every tick reads,
    hiding the runs that must be projected."""
    defs, instance = sensor_defs(resource), dg.DagsterInstance.ephemeral()
    export = a_stale_export_run(defs, instance, store, runs["c"] + timedelta(minutes=1))

    past_day = tick_sensor("run_snapshots_sensor", defs=defs, instance=instance)
    after = tick_sensor("run_snapshots_sensor", defs=defs, instance=instance)

    assert [r.dagster_run.tags["dagster/partition"] for r in past_day.results] == [days.yesterday_key]
    assert past_day.failed == 0 and export.run_id not in store.stale_runs()
    assert after.requested == 0  # the projection run is today's, and waits
