"""The instance from dagster.yaml: Postgres storage, queued runs with the `concurrency:` block's tag limits,
retries, monitoring, no telemetry; and nothing runstate relies on is missing from it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psycopg
import pytest
import yaml
from dagster_postgres.run_storage import PostgresRunStorage

from runstate.defs.instance.checks import missing_bounds
from runstate.defs.pool import set_spark_pool_limit
from runstate.defs.tags import DATASET_TAG, MERGE_SHARD_TAG, SPARK_TAG, TABLE_TAG, WAL_SHARD_TAG

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def instance(fresh_database: str, monkeypatch) -> Iterator[dg.DagsterInstance]:
    monkeypatch.setenv("DAGSTER_PG_URL", fresh_database.replace("postgresql://", "postgresql+psycopg2://", 1))
    instance = dg.DagsterInstance.from_config(str(REPO_ROOT))
    yield instance
    instance.dispose()


@dg.op
def say_hello() -> str:
    return "hello"


@dg.job(tags={DATASET_TAG: "orders"})
def hello_job() -> None:
    say_hello()


def test_a_storage_only_instance_with_a_bare_postgresql_url_stores_a_run_and_its_events(
    tmp_path, fresh_database
):
    """A platform team's dagster.yaml names no driver (`postgres_db:` builds `postgresql://`). SQLAlchemy
    2.1 made psycopg 3 that scheme's driver, on which dagster-postgres's event writes fail (`NOTIFY
    run_events, $1`: a syntax error), so every run and daemon of their instance did; runstate pins
    SQLAlchemy below 2.1."""
    (tmp_path / "dagster.yaml").write_text(
        yaml.safe_dump({"storage": {"postgres": {"postgres_url": fresh_database}}})
    )
    with dg.DagsterInstance.from_config(str(tmp_path)) as plain:
        result = hello_job.execute_in_process(instance=plain)
        events = plain.all_logs(result.run_id)

    assert fresh_database.startswith("postgresql://")
    assert result.success and len(events) > 5


def test_a_run_lands_in_postgres_run_and_event_storage(instance, fresh_database):
    result = hello_job.execute_in_process(instance=instance)

    assert result.success
    with psycopg.connect(fresh_database) as conn:
        run = conn.execute(
            "SELECT pipeline_name, status FROM runs WHERE run_id = %s", (result.run_id,)
        ).fetchone()
        events = conn.execute(
            "SELECT count(*) FROM event_logs WHERE run_id = %s", (result.run_id,)
        ).fetchone()[0]
        tags = dict(
            conn.execute("SELECT key, value FROM run_tags WHERE run_id = %s", (result.run_id,)).fetchall()
        )
    assert run == ("hello_job", "SUCCESS")
    assert events > 0
    assert tags[DATASET_TAG] == "orders"


def test_storage_coordinator_retries_and_telemetry_come_from_dagster_yaml(instance):
    limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits

    assert isinstance(instance.run_storage, PostgresRunStorage)
    assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
    assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
    assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
    for tag in (WAL_SHARD_TAG, MERGE_SHARD_TAG, TABLE_TAG):
        assert {"key": tag, "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits
    assert instance.run_retries_enabled and instance.run_retries_max_retries == 3
    assert instance.run_monitoring_enabled
    assert instance.telemetry_enabled is False


def test_sensors_schedules_and_the_queue_are_tuned_for_freshness(instance):
    """A slow sensor must not delay wal_sensor, and a queued flush must not wait long for its turn."""
    assert instance.get_settings("sensors") == {"use_threads": True, "num_workers": 4}
    assert instance.get_settings("schedules")["use_threads"] is True
    assert instance.run_coordinator.dequeue_interval_seconds <= 2
    assert instance.run_coordinator.inst_data.config_dict["dequeue_use_threads"] is True


def test_the_run_limits_live_in_the_concurrency_block_and_spark_in_a_pool_not_a_tag_limit():
    """Dagster refuses tag limits under run_coordinator beside `concurrency:`; only the queue's pace is there."""
    config = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    limits = config["concurrency"]["runs"]["tag_concurrency_limits"]

    assert set(config["run_coordinator"]["config"]) == {
        "dequeue_interval_seconds",
        "dequeue_use_threads",
        "dequeue_num_workers",
    }
    assert {limit["key"] for limit in limits} == {WAL_SHARD_TAG, MERGE_SHARD_TAG, TABLE_TAG}
    assert SPARK_TAG not in {limit["key"] for limit in limits}
    assert "default_limit" not in config["concurrency"].get("pools", {})  # it would bound others' pools


def test_with_its_pool_limit_set_the_projects_instance_lacks_nothing_runstate_relies_on(instance):
    before = missing_bounds(instance)
    set_spark_pool_limit(instance, 2)  # what `runstate db upgrade` and `services up` do

    assert [bound.name for bound in before] == ["a limit for the pool runstate_spark"]
    assert missing_bounds(instance) == []


def test_the_storage_url_is_read_from_the_environment_not_written_down():
    config = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())

    assert config["storage"]["custom"]["config"]["postgres_url"] == {"env": "DAGSTER_PG_URL"}


def test_the_queue_admits_one_run_per_wal_shard_and_one_per_table(instance):
    from dagster._core.storage.dagster_run import DagsterRun
    from dagster._utils.tags import TagConcurrencyLimitsCounter

    def run(**tags: str) -> DagsterRun:
        return DagsterRun(job_name="any", tags=tags)

    limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    in_progress = [run(**{WAL_SHARD_TAG: "0"}), run(**{TABLE_TAG: "db.events"})]
    counter = TagConcurrencyLimitsCounter(limits, in_progress)

    assert counter.is_blocked(run(**{WAL_SHARD_TAG: "0"}))
    assert not counter.is_blocked(run(**{WAL_SHARD_TAG: "1"}))
    assert counter.is_blocked(run(**{TABLE_TAG: "db.events"}))
    assert not counter.is_blocked(run(**{TABLE_TAG: "db.other"}))


# ----- ticks use the deployment's instance (never an ephemeral one)


@dg.sensor(job=hello_job, minimum_interval_seconds=1)
def counting_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    """Requests run `n` on tick `n`, where n comes from the cursor: a lost cursor re-requests run 1."""
    tick = int(context.cursor or 0) + 1
    return dg.SensorResult(run_requests=[dg.RunRequest(run_key=f"tick-{tick}")], cursor=str(tick))


@pytest.fixture
def deployment_env(fresh_database: str, monkeypatch) -> str:
    """No DAGSTER_HOME, as in a shell: the checkout's dagster.yaml, on a database of the test's own."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    dagster_url = fresh_database.replace("postgresql://", "postgresql+psycopg2://", 1)
    monkeypatch.setenv("DAGSTER_PG_URL", dagster_url)
    return fresh_database


def test_without_dagster_home_a_tick_uses_the_checkouts_instance(deployment_env):
    from runstate.commands.instance import default_instance

    with default_instance() as instance:
        assert instance.root_directory == str(REPO_ROOT)
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert not instance.is_ephemeral


def test_two_ticks_share_a_cursor_and_their_runs_are_in_the_instance(deployment_env):
    from runstate.commands.ticking import tick_sensor

    defs = dg.Definitions(jobs=[hello_job], sensors=[counting_sensor])

    first = tick_sensor("counting_sensor", defs=defs)
    second = tick_sensor("counting_sensor", defs=defs)

    assert (first.succeeded, second.succeeded) == (1, 1)
    with dg.DagsterInstance.from_config(str(REPO_ROOT)) as instance:
        runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/sensor_name": "counting_sensor"}))
        assert sorted(run.tags["dagster/run_key"] for run in runs) == ["tick-1", "tick-2"]
        assert {run.status for run in runs} == {dg.DagsterRunStatus.SUCCESS}


def test_a_run_key_launched_by_an_earlier_tick_is_not_launched_again(deployment_env):
    from runstate.commands.ticking import CURSOR_KEY, tick_sensor

    defs = dg.Definitions(jobs=[hello_job], sensors=[counting_sensor])
    tick_sensor("counting_sensor", defs=defs)
    with dg.DagsterInstance.from_config(str(REPO_ROOT)) as instance:
        instance.run_storage.set_cursor_values(
            {CURSOR_KEY.format("counting_sensor"): ""}
        )  # the cursor is lost

    again = tick_sensor("counting_sensor", defs=defs)

    assert again.skipped_run_keys == ["tick-1"] and again.results == []
