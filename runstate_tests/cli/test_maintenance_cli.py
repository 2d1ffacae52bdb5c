"""`runstate maintenance ...` and `runstate health` through click's CliRunner on a real Postgres schema."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner, Result

from runstate.cli import main
from runstate.config import settings
from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.models import CachedTable
from runstate.maintenance.store import MaintenanceStore


@pytest.fixture
def cli_env(pg_database: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch):
    """Point the CLI at the test's schema; settings() is cached, so clear it around the test."""
    monkeypatch.setenv("RUNSTATE_PG_URL", pg_database)
    monkeypatch.setenv("RUNSTATE_SCHEMA", pg_schema)
    settings.cache_clear()
    yield
    settings.cache_clear()


@pytest.fixture
def store(cli_env, pg_database, pg_schema):
    with MaintenanceStore(pg_database, schema=pg_schema) as s:
        s.ensure_schema()
        s.cache.replace_table_cache([CachedTable("db", "orders", True, {})])
        yield s


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def test_submit_status_cancel(store):
    submitted = run(
        "maintenance",
        "submit",
        "db.orders",
        "-a",
        "rewrite_manifests,rewrite_data_files",
        "--dry-run",
        "-o",
        "retain_last=4",
    )
    job_id = submitted.output.strip()

    listed = run("maintenance", "status")
    shown = run("maintenance", "status", job_id, "--json")
    cancelled = run("maintenance", "cancel", job_id)

    assert submitted.exit_code == 0, submitted.output
    assert job_id in listed.output and "rewrite_data_files,rewrite_manifests" in listed.output
    job = json.loads(shown.output)["job"]
    assert (job["dry_run"], job["options"], job["status"]) == (True, {"retain_last": 4}, "pending")
    assert cancelled.output.strip() == f"{job_id} cancelled"
    assert store.queue.get_job(job_id).status == "cancelled"


def test_delete_hides_a_job_from_status_and_a_second_delete_is_an_error(store):
    job_id = store.submit("db", "orders", ["rewrite_manifests"])

    deleted = run("maintenance", "delete", job_id)
    again = run("maintenance", "delete", job_id)
    unknown = run("maintenance", "delete", "00000000-0000-0000-0000-000000000000")
    listed = run("maintenance", "status")

    assert (deleted.exit_code, deleted.output.strip()) == (0, f"{job_id} deleted")
    assert again.exit_code == 1 and "already deleted" in again.output
    assert unknown.exit_code == 1 and "does not exist" in unknown.output
    assert job_id not in listed.output
    job = store.queue.get_job(job_id)
    assert job.status == "cancelled" and job.deleted_at is not None


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["db.orders;drop"], "not a valid identifier"),
        (["db.orders", "-a", "vacuum"], "unknown maintenance action"),
        (["db.orders", "-o", "orphan_older_than_hours=1"], "under 24"),
        (["db.elsewhere"], "runstate maintenance sync"),
    ],
)
def test_bad_submissions_print_one_clear_line_and_write_nothing(store, args, fragment):
    result = run("maintenance", "submit", *args)

    assert result.exit_code == 1 and fragment in result.output and "Traceback" not in result.output
    assert store.queue.list_jobs() == []


def test_unknown_job_is_a_clear_error(store):
    result = run("maintenance", "cancel", "no-such-job")
    assert result.exit_code == 1 and "no-such-job" in result.output


def test_tick_with_an_empty_queue_requests_nothing(store):
    result = run("maintenance", "tick")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("requested 0")


@pytest.mark.spark
def test_health_analyzes_records_and_reads_back(store, spark, iceberg_namespace):
    ref = TableRef(iceberg_namespace, "events")
    spark.sql(f"CREATE TABLE lake.{ref.quoted} (id BIGINT) USING iceberg")
    spark.range(60).repartition(6).writeTo(f"lake.{ref.quoted}").append()

    fresh = run("health", ref.key)
    cached = run("health", ref.key, "--cached")

    assert fresh.exit_code == 0, fresh.output
    report = json.loads(fresh.output)
    assert (report["total_data_files"], report["recommended_actions"]) == (6, ["rewrite_data_files"])
    assert json.loads(cached.output)["total_data_files"] == 6


@pytest.mark.spark
def test_sync_copies_the_catalog_into_the_cache_with_the_opt_in(store, spark, iceberg_namespace):
    """`maintenance sync` on the worker's Spark session (the CLI's builder gets the running one back)."""
    spark.sql(
        f"CREATE TABLE lake.{iceberg_namespace}.opted (id BIGINT) USING iceberg "
        "TBLPROPERTIES ('runstate.maintenance.enabled'='true', 'runstate.maintenance.cadence-hours'='6')"
    )
    spark.sql(f"CREATE TABLE lake.{iceberg_namespace}.plain (id BIGINT) USING iceberg")

    synced = run("maintenance", "sync")

    assert synced.exit_code == 0, synced.output
    assert synced.output.startswith("cached "), synced.output
    cached = {(t.database, t.table): t for t in store.cache.cached_tables()}
    assert cached[(iceberg_namespace, "opted")].maintenance_enabled is True
    assert cached[(iceberg_namespace, "plain")].maintenance_enabled is None
    assert ("db", "orders") not in cached  # the whole cache is replaced by the catalog's listing
    submitted = run("maintenance", "submit", f"{iceberg_namespace}.opted", "-a", "rewrite_manifests")
    assert submitted.exit_code == 0, submitted.output
