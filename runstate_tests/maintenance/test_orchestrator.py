"""The orchestrator's decisions and its audit row, on the real store (and real Spark where health is read)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runstate.maintenance.health import HealthAnalyzer
from runstate.maintenance.identifiers import APPLY_DELETES_ACTIONS, APPLY_DELETES_OPTIONS, TableRef
from runstate.maintenance.models import CachedTable
from runstate.maintenance.orchestrator import (
    ADVISED,
    HEALTHY,
    SKIPPED_ACTIVE_JOB,
    SKIPPED_CADENCE,
    SKIPPED_MISSING,
    SKIPPED_NOT_OPTED_IN,
    SUBMITTED,
    Orchestrator,
    OrchestratorSettings,
)
from runstate.maintenance.runner import run_job


def must_not_analyze(ref: TableRef):
    raise AssertionError(f"{ref.key} should have been skipped before any health check")


def decisions(report) -> dict[str, str]:
    return {d.table_key: d.decision for d in report.decisions}


def test_skips_not_opted_in_active_and_within_cadence_without_touching_spark(store):
    store.cache.replace_table_cache(
        [
            CachedTable("db", "unset", None, {}),
            CachedTable("db", "off", False, {}),
            CachedTable("db", "busy", True, {}),
            CachedTable("db", "recent", True, {}),
        ]
    )
    busy_job = store.submit("db", "busy", ["rewrite_manifests"])
    recent_job = store.submit("db", "recent", ["rewrite_manifests"])
    claim = store.claim("w", lease_seconds=60)
    while claim.job_id != recent_job:  # finish only the "recent" table's job
        claim = store.claim("w", lease_seconds=60)
    store.complete(claim, "completed")

    report = Orchestrator(store, must_not_analyze).run()

    assert decisions(report) == {
        "db.unset": SKIPPED_NOT_OPTED_IN,
        "db.off": SKIPPED_NOT_OPTED_IN,
        "db.busy": SKIPPED_ACTIVE_JOB,
        "db.recent": SKIPPED_CADENCE,
    }
    assert next(d for d in report.decisions if d.table_key == "db.busy").job_id == busy_job
    run = store.history.orchestrator_runs(limit=1)[0]
    assert (
        run.status,
        run.tables_assessed,
        run.tables_skipped,
        run.tables_healthy,
        run.jobs_submitted,
        run.jobs_completed,
        run.jobs_failed,
        run.dry_run,
    ) == ("completed", 4, 4, 0, 0, 0, 0, False)
    assert run.id == report.run_id


def test_a_per_table_cadence_overrides_the_default(store):
    store.cache.replace_table_cache(
        [
            CachedTable("db", "hourly", True, {"maintenance_cadence_hours": 1}),
            CachedTable("db", "daily", True, {}),
            CachedTable("db", "always", True, {"maintenance_cadence_hours": 0}),
        ]
    )
    for table in ("hourly", "daily", "always"):
        store.submit("db", table, ["rewrite_manifests"])
        store.complete(store.claim("w", lease_seconds=60), "completed")
    analyzed = []

    def record_and_refuse(ref):
        analyzed.append(ref.key)
        raise LookupError("not in this test")

    in_two_hours = lambda: datetime.now(UTC) + timedelta(hours=2)  # noqa: E731
    report = Orchestrator(store, record_and_refuse, now=in_two_hours).run()

    assert sorted(analyzed) == [
        "db.always",
        "db.hourly",
    ]  # past its 1 h cadence, no cadence; "daily" within 24 h
    assert decisions(report)["db.daily"] == SKIPPED_CADENCE
    assert report.status == "completed_with_errors" and "db.hourly" in report.error
    assert store.history.orchestrator_runs(limit=1)[0].error == report.error


def test_a_job_that_only_applied_deletes_does_not_hold_back_the_cadence(store):
    """apply_deletes_sensor may submit such jobs every few merges; the table's other maintenance
    (expiry, manifests, orphans) must still come at the cadence."""
    store.cache.replace_table_cache(
        [CachedTable("db", "merged", True, {}), CachedTable("db", "maintained", True, {})]
    )
    store.submit("db", "maintained", ["rewrite_manifests"])
    store.complete(store.claim("w", lease_seconds=60), "completed")
    for table in ("merged", "maintained"):
        store.submit("db", table, APPLY_DELETES_ACTIONS, options=APPLY_DELETES_OPTIONS)
        store.complete(store.claim("w", lease_seconds=60), "completed")
    analyzed = []

    def record_and_refuse(ref):
        analyzed.append(ref.key)
        raise LookupError("not in this test")

    report = Orchestrator(store, record_and_refuse).run()

    assert analyzed == ["db.merged"]  # its only job applied deletes: not within the cadence
    assert decisions(report)["db.maintained"] == SKIPPED_CADENCE  # its rewrite_manifests job still counts
    assert store.queue.last_cadence_job(TableRef("db", "maintained")).actions == ("rewrite_manifests",)
    assert store.queue.last_cadence_job(TableRef("db", "merged")) is None


def make_table(spark, namespace, name, *, files, rows, deletes):
    ref = TableRef(namespace, name)
    spark.sql(
        f"CREATE TABLE lake.{ref.quoted} (id BIGINT) USING iceberg TBLPROPERTIES "
        "('format-version'='2', 'write.delete.mode'='merge-on-read')"
    )
    spark.range(rows).repartition(files).writeTo(f"lake.{ref.quoted}").append()
    if deletes:
        spark.sql(f"DELETE FROM lake.{ref.quoted} WHERE id % 7 = 0")
    return ref


@pytest.mark.spark
def test_dry_run_only_advises_and_healthy_tables_are_counted(spark, iceberg_namespace, store):
    sick = make_table(spark, iceberg_namespace, "sick", files=6, rows=60, deletes=True)
    fine = make_table(spark, iceberg_namespace, "fine", files=1, rows=10, deletes=False)
    store.cache.replace_table_cache(
        [CachedTable(r.database, r.table, True, {}) for r in (sick, fine)]
        + [CachedTable(iceberg_namespace, "dropped_since_sync", True, {})]
    )
    analyzer = HealthAnalyzer(spark)

    report = Orchestrator(store, analyzer.analyze, OrchestratorSettings(dry_run=True)).run()

    assert decisions(report) == {
        sick.key: ADVISED,
        fine.key: HEALTHY,
        f"{iceberg_namespace}.dropped_since_sync": SKIPPED_MISSING,
    }
    advice = next(d for d in report.decisions if d.table_key == sick.key)
    assert advice.recommended_actions == ["rewrite_data_files", "rewrite_position_delete_files"]
    assert store.queue.list_jobs() == []  # advisory only
    assert store.history.latest_health(sick).needs_maintenance  # the assessment is kept
    run = store.history.orchestrator_runs(limit=1)[0]
    assert (run.dry_run, run.tables_assessed, run.tables_skipped, run.tables_healthy, run.jobs_submitted) == (
        True,
        3,
        1,
        1,
        0,
    )

    submitted = Orchestrator(store, analyzer.analyze).run()

    job = store.queue.active_job(sick)
    assert decisions(submitted)[sick.key] == "submitted" and job.actions == tuple(advice.recommended_actions)
    assert store.history.orchestrator_runs(limit=1)[0].jobs_submitted == 1


def test_deletes_are_applied_by_rewriting_their_data_files(spark, iceberg_namespace, store):
    # The demo's case: 3 data files, 2 delete files. Combining 2 delete files changes nothing; every
    # submitted job must change its table, and this one leaves no delete file.
    ref = make_table(spark, iceberg_namespace, "few", files=3, rows=30, deletes=False)
    for key in (1, 2):
        spark.sql(f"DELETE FROM lake.{ref.quoted} WHERE id = {key}")
    store.cache.replace_table_cache([CachedTable(ref.database, ref.table, True, {})])

    report = Orchestrator(
        store, HealthAnalyzer(spark).analyze, OrchestratorSettings(default_cadence_hours=0)
    ).run()

    [decision] = [d for d in report.decisions if d.table_key == ref.key]
    assert decision.decision == SUBMITTED
    assert decision.recommended_actions == ["rewrite_data_files", "rewrite_position_delete_files"]
    claim = store.claim("w", 60)
    outcome = run_job(spark, store, claim)
    assert outcome.status == "completed", outcome.error
    applied, dropped = store.queue.job_actions(claim.job_id)
    assert applied.before["delete_files"] > 0 and dropped.after["delete_files"] == 0
    assert applied.after["snapshot_id"] != applied.before["snapshot_id"]
    assert [r.id for r in spark.sql(f"SELECT id FROM lake.{ref.quoted} WHERE id < 3").collect()] == [0]
