"""run_history in Dagster, in-process: the sensor's decision, the export run it requests (the core's
export on the shared Spark session), the bound of one export at a time, and the lag check."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime

import dagster as dg
import pytest

from runstate.commands.ticking import tick_sensor
from runstate.config import Settings
from runstate.defs.eventstore.history import EXPORT_JOB, build_history_defs
from runstate.defs.eventstore.resources import EventStoreResource, SnowflakeConnection
from runstate.defs.spark import SparkResource
from runstate.defs.tags import (
    HISTORY_CAN_WAIT_TAG,
    HISTORY_CAN_WAIT_TAGS,
    HOUSEKEEPING_TAG,
    HOUSEKEEPING_TAGS,
    SPARK_TAG,
)
from runstate.eventstore import EventType, NewEvent
from runstate.eventstore.lake import HistoryConfig
from runstate_tests.support.lake import append_randomly, assert_lake_equals_feed
from runstate_tests.support.runs import started_run

pytestmark = [pytest.mark.spark]
MAX_LAG_EVENTS = 5


@pytest.fixture
def own_resource(migrated_database: str) -> Iterator[EventStoreResource]:
    """The event store resource on a database of the test's own (the root conftest's own_store says why)."""
    resource = EventStoreResource(backend="postgres", pg_url=migrated_database, pg_schema="runstate")
    yield resource
    resource.close()


def history_defs(event_store: EventStoreResource, spark_settings, history: HistoryConfig) -> dg.Definitions:
    """The run history's definitions on the test's store, catalog, warehouse and namespace."""
    s = Settings.from_env(
        {
            "RUNSTATE_PG_URL": spark_settings.pg_url,
            "RUNSTATE_WAREHOUSE": str(spark_settings.warehouse_dir),
            "RUNSTATE_HISTORY_NAMESPACE": history.namespace,
            "RUNSTATE_HISTORY_MAX_LAG_EVENTS": str(MAX_LAG_EVENTS),
        }
    )
    resources = {"event_store": event_store, "spark": SparkResource.from_settings(spark_settings)}
    return dg.Definitions.merge(build_history_defs(s), dg.Definitions(resources=resources))


def lag_check(defs: dg.Definitions, instance: dg.DagsterInstance) -> dg.AssetCheckEvaluation:
    result = defs.resolve_job_def("run_history_lag_check").execute_in_process(instance=instance)
    [evaluation] = result.get_asset_check_evaluations()
    return evaluation


def test_the_sensor_requests_one_export_whose_run_brings_the_lake_to_the_feed(
    spark, spark_settings, own_resource, history, bare_instance
):
    defs = history_defs(own_resource, spark_settings, history)
    store = own_resource.get_store()
    append_randomly(store, random.Random(31), runs=5, appends=20)
    behind = lag_check(defs, bare_instance)

    tick = tick_sensor("run_history_sensor", defs=defs, instance=bare_instance)
    idle = tick_sensor("run_history_sensor", defs=defs, instance=bare_instance)

    assert not behind.passed and behind.metadata["behind_events"].value == MAX_LAG_EVENTS + 1
    assert (tick.requested, tick.succeeded) == (1, 1)
    [run] = tick.results
    assert run.dagster_run.tags[SPARK_TAG] == "session"
    [materialization] = run.asset_materializations_for_node("run_history")
    feed = assert_lake_equals_feed(spark, store, history)
    assert materialization.metadata["events_exported"].value == len(feed)
    assert materialization.metadata["position"].value == feed[-1].position
    assert idle.requested == 0 and idle.skip_reason == "the run history has every event of the feed"
    assert lag_check(defs, bare_instance).passed


def test_while_an_export_run_is_alive_the_sensor_requests_no_other(
    spark_settings, own_resource, history, bare_instance
):
    defs = history_defs(own_resource, spark_settings, history)
    store = own_resource.get_store()
    append_randomly(store, random.Random(32), runs=2, appends=3)
    running = started_run(bare_instance, defs.resolve_job_def(EXPORT_JOB))

    tick = tick_sensor("run_history_sensor", defs=defs, instance=bare_instance)

    assert tick.requested == 0
    assert tick.skip_reason.startswith(f"an export is in progress: run {running.run_id}")


def test_on_a_snowflake_store_the_sensor_exports_nothing_and_says_why(
    spark_settings, snowflake_schema, history, bare_instance
):
    conn_kwargs, schema = snowflake_schema
    fields = ("account", "user", "password", "database", "network_timeout", "host", "port", "protocol")
    snowflake = SnowflakeConnection(**{key: conn_kwargs[key] for key in fields})
    resource = EventStoreResource(backend="snowflake", snowflake=snowflake, snowflake_schema=schema)
    defs = history_defs(resource, spark_settings, history)

    tick = tick_sensor("run_history_sensor", defs=defs, instance=bare_instance)

    assert tick.requested == 0 and "Snowflake feed has no commit-ordered high-water mark" in tick.skip_reason


def test_the_export_runs_own_events_alone_request_no_export(
    spark_settings, own_resource, history, bare_instance
):
    """The run recorder appends each export run's events to the feed: an export for them alone would
    record another export run, and an idle deployment would export once a minute for ever."""
    defs = history_defs(own_resource, spark_settings, history)
    store = own_resource.get_store()
    ref = {"dagster_run_id": "exporting", "job_name": EXPORT_JOB}
    store.append(NewEvent("exporting", EventType.RUN_STARTED, datetime.now(UTC), engine_run_ref=ref))

    tick = tick_sensor("run_history_sensor", defs=defs, instance=bare_instance)

    assert tick.requested == 0 and tick.skip_reason.startswith(
        "only 1 event(s) of runs that can wait are pending"
    )


def append_run_started(resource: EventStoreResource, run_id: str, job_name: str) -> None:
    ref = {"dagster_run_id": run_id, "job_name": job_name}
    resource.get_store().append(
        NewEvent(run_id, EventType.RUN_STARTED, datetime.now(UTC), engine_run_ref=ref)
    )


def test_housekeeping_runs_events_alone_request_no_export_and_any_other_run_does(
    spark_settings, own_resource, history, bare_instance
):
    """The scheduled sweeps and checks run every few minutes: an export for each left an idle deployment
    starting two Spark exports every five minutes. A job is housekeeping by its tag; a job tagged
    HISTORY_CAN_WAIT_TAG (the always-on flush runs) waits the same way."""

    @dg.op
    def sweep() -> None:
        pass

    def job(name: str, tags: dict[str, str]) -> dg.JobDefinition:
        return dg.JobDefinition(name=name, graph_def=dg.GraphDefinition(name, node_defs=[sweep]), tags=tags)

    swept, recurring = job("a_sweep", HOUSEKEEPING_TAGS), job("a_recurring_flush", HISTORY_CAN_WAIT_TAGS)
    defs = dg.Definitions.merge(
        history_defs(own_resource, spark_settings, history), dg.Definitions(jobs=[swept, recurring])
    )
    append_run_started(own_resource, "checking", "run_history_lag_check")
    append_run_started(own_resource, "sweeping", swept.name)
    append_run_started(own_resource, "handing-over", recurring.name)

    def evaluate() -> dg.SensorResult | dg.SkipReason:  # without executing the export it may request
        resources = {"event_store": own_resource}
        with dg.build_sensor_context(
            instance=bare_instance, definitions=defs, resources=resources
        ) as context:
            return defs.resolve_sensor_def("run_history_sensor")(context)

    housekeeping_only = evaluate()
    append_run_started(own_resource, "working", "orders_etl")
    with_other_work = evaluate()

    assert isinstance(housekeeping_only, dg.SkipReason)
    assert housekeeping_only.skip_message.startswith("only 3 event(s) of runs that can wait are pending")
    assert isinstance(with_other_work, dg.SensorResult) and len(with_other_work.run_requests) == 1


def test_the_deployments_sweeps_and_checks_are_housekeeping_and_its_work_is_not():
    """The flush runs are work, but recur on their own (an always-on shard's run hands over every run
    budget, idle or not): their history can wait, and no other job's does."""
    from runstate.definitions import defs

    def tagged(name: str) -> bool:
        return defs.resolve_job_def(name).tags.get(HOUSEKEEPING_TAG) == "true"

    sweeps_and_checks = [
        "maintenance_claim_sweep",
        "maintenance_lock_sweep",
        "maintenance_health_retention",
        "wal_lag_check",
        "run_history_lag_check",
    ]
    assert all(map(tagged, sweeps_and_checks))
    work = ["flush_wal", "maintenance_orchestrator_job", EXPORT_JOB, "run_snapshots_job"]
    assert not any(map(tagged, work))
    waiting = [
        job.name for job in defs.resolve_all_job_defs() if job.tags.get(HISTORY_CAN_WAIT_TAG) == "true"
    ]
    assert waiting == ["flush_wal"]


def test_a_projection_runs_events_alone_request_no_export(
    spark_settings, own_resource, history, bare_instance
):
    """A projection run's events made an export due, whose run made a projection due: one of each a
    minute for ever."""
    defs = history_defs(own_resource, spark_settings, history)
    ref = {"dagster_run_id": "projecting", "job_name": "run_snapshots_job"}
    own_resource.get_store().append(
        NewEvent("projecting", EventType.RUN_STARTED, datetime.now(UTC), engine_run_ref=ref)
    )

    tick = tick_sensor("run_history_sensor", defs=defs, instance=bare_instance)

    assert tick.requested == 0 and tick.skip_reason.startswith("only 1 event(s) of runs that can wait")
