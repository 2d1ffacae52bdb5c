"""The instance from dagster.yaml: Postgres storage, queued runs with tag limits, run retries, no telemetry."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import dagster as dg
import psycopg
import pytest
import yaml

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


@dg.job(tags={"runstate/dataset": "orders"})
def hello_job() -> None:
    say_hello()


def test_a_run_lands_in_postgres_run_and_event_storage(instance, fresh_database):
    result = hello_job.execute_in_process(instance=instance)

    assert result.success
    with psycopg.connect(fresh_database) as conn:
        run = conn.execute("SELECT pipeline_name, status FROM runs WHERE run_id = %s", (result.run_id,)).fetchone()
        events = conn.execute("SELECT count(*) FROM event_logs WHERE run_id = %s", (result.run_id,)).fetchone()[0]
        tags = dict(conn.execute("SELECT key, value FROM run_tags WHERE run_id = %s", (result.run_id,)).fetchall())
    assert run == ("hello_job", "SUCCESS")
    assert events > 0
    assert tags["runstate/dataset"] == "orders"


def test_storage_coordinator_retries_and_telemetry_come_from_dagster_yaml(instance):
    limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits

    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
    assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
    assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
    assert {"key": "runstate/wal_shard", "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits
    assert {"key": "runstate/table", "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits
    assert instance.run_retries_enabled and instance.run_retries_max_retries == 3
    assert instance.run_monitoring_enabled
    assert instance.telemetry_enabled is False


def test_the_storage_url_is_read_from_the_environment_not_written_down():
    config = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())

    assert config["storage"]["postgres"]["postgres_url"] == {"env": "DAGSTER_PG_URL"}


def test_the_queue_admits_one_run_per_wal_shard_and_one_per_table(instance):
    from dagster._core.storage.dagster_run import DagsterRun
    from dagster._utils.tags import TagConcurrencyLimitsCounter

    def run(**tags: str) -> DagsterRun:
        return DagsterRun(job_name="any", tags=tags)

    limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    in_progress = [run(**{"runstate/wal_shard": "0"}), run(**{"runstate/table": "db.events"})]
    counter = TagConcurrencyLimitsCounter(limits, in_progress)

    assert counter.is_blocked(run(**{"runstate/wal_shard": "0"}))
    assert not counter.is_blocked(run(**{"runstate/wal_shard": "1"}))
    assert counter.is_blocked(run(**{"runstate/table": "db.events"}))
    assert not counter.is_blocked(run(**{"runstate/table": "db.other"}))
