"""`runstate demo`: the whole pipeline end to end on the embedded services, driven through ticks.

It seeds realistic data (workflow runs, WAL changes for several datasets, Iceberg tables with many
small files and position deletes), drives the sensors and schedules the daemon would, exports the run
history into the lake and asks it a question, and returns a summary. Every seed is idempotent: run ids
(one set a day: the runs are yesterday's, so the history's "last 7 days" finds them) and client tokens
are fixed, and the demo tables are recreated, so a second run works and shows the same picture.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import dagster as dg

from runstate.commands.ticking import TickResult, execute_run, tick_schedule, tick_sensor
from runstate.config import settings
from runstate.eventstore import EventType, NewEvent
from runstate.eventstore.lake.config import HistoryConfig
from runstate.wal import Change, DatasetReader, WalProducer
from runstate.wal.dataset_tables import read_table, table_ident

DEMO_NAMESPACE = "demo"
DEMO_TABLES = ("page_views", "orders")
DEMO_DATASETS = ("orders", "customers", "inventory")
WORKFLOWS = ("ingest-orders", "score-customers", "rebuild-inventory")
MAX_TICKS = 20
WAL_TICK_INTERVAL_S = 5  # wal_sensor's interval under the daemon
RUN_LOG_LEVEL = "INFO"  # the runs' own INFO lines tell the story; DEBUG engine events drown it

Progress = Callable[[str, int], Any]


class TableCounts(NamedTuple):
    files: int = 0
    snapshots: int = 0
    delete_files: int = 0


@dataclass
class TableFigures:
    table: str
    before: TableCounts = TableCounts()
    after: TableCounts = TableCounts()
    rows_equal: bool = False


@dataclass
class DemoSummary:
    events_appended: int = 0
    events_idempotent: int = 0
    runs_projected: dict[str, str] = field(default_factory=dict)
    dagster_runs_recorded: int = 0
    datasets: dict[str, tuple[int, int]] = field(default_factory=dict)  # dataset -> (version, keys)
    flush_runs: int = 0
    tables: list[TableFigures] = field(default_factory=list)
    maintenance_runs: int = 0
    jobs_completed: int = 0
    failed_runs: list[str] = field(default_factory=list)
    merge_runs: int = 0
    seeded_runs: set[str] = field(default_factory=set)
    history_table: str = ""
    history_events: int = 0
    failed_steps_by_type: dict[str, int] = field(default_factory=dict)


def demo_instance() -> dg.DagsterInstance:
    """The deployment's own instance (dagster.yaml, Postgres storage), so the demo's runs show in the UI."""
    from runstate.services.dev import dagster_home

    os.environ.setdefault("DAGSTER_HOME", str(dagster_home(os.environ)))
    os.environ.setdefault("DAGSTER_PG_URL", settings().dagster_pg_url)
    return dg.DagsterInstance.get()


def _note(result: TickResult, summary: DemoSummary) -> TickResult:
    summary.failed_runs += [r.run_id for r in result.results if not r.success]
    return result


# --- 1. the run state store -------------------------------------------------------------------------


def workflow_events(run_id: str, started: datetime, steps: int, fail_step: int | None) -> list[NewEvent]:
    """A realistic run: steps that start and complete, one retried step, artifacts, a terminal event."""
    at = iter(started + timedelta(seconds=i) for i in range(1000))
    events = [NewEvent(run_id, EventType.RUN_STARTED, next(at), data={"workflow": run_id.rsplit("-", 1)[0]})]
    for n in range(1, steps + 1):
        step = f"step-{n}"
        events.append(
            NewEvent(run_id, EventType.STEP_STARTED, next(at), step_id=step, logical_attempt_id="1")
        )
        if n == fail_step:
            events.append(
                NewEvent(
                    run_id,
                    EventType.STEP_FAILED,
                    next(at),
                    step_id=step,
                    logical_attempt_id="1",
                    data={"error": "upstream timeout"},
                )
            )
            events.append(
                NewEvent(run_id, EventType.STEP_RETRYING, next(at), step_id=step, logical_attempt_id="1")
            )
            events.append(
                NewEvent(run_id, EventType.STEP_STARTED, next(at), step_id=step, logical_attempt_id="2")
            )
        attempt = "2" if n == fail_step else "1"
        events.append(
            NewEvent(
                run_id,
                EventType.ARTIFACT_EMITTED,
                next(at),
                step_id=step,
                logical_attempt_id=attempt,
                data={"uri": f"s3://artifacts/{run_id}/{step}.parquet"},
            )
        )
        events.append(
            NewEvent(run_id, EventType.STEP_COMPLETED, next(at), step_id=step, logical_attempt_id=attempt)
        )
    events.append(NewEvent(run_id, EventType.RUN_COMPLETED, next(at)))
    return events


def seed_runs(store: Any, summary: DemoSummary, progress: Progress) -> None:
    started = datetime.now(UTC).replace(hour=8, minute=0, second=0, microsecond=0) - timedelta(days=1)
    for i, workflow in enumerate(WORKFLOWS):
        # The day's ids: a second demo the same day re-sends the same events idempotently.
        run_id = f"{workflow}-{started:%Y%m%d}"
        summary.seeded_runs.add(run_id)
        results = store.append_batch(run_id, workflow_events(run_id, started + timedelta(hours=i), 4 + i, 2))
        summary.events_appended += sum(1 for r in results if r.persisted)
        summary.events_idempotent += sum(1 for r in results if r.idempotent)
        summary.runs_projected[run_id] = store.project(run_id).status
        progress("workflow runs", 1)


# --- 2. the dataset WAL -----------------------------------------------------------------------------


def wal_changes(dataset: str, n: int) -> list[Change]:
    rng = random.Random(f"{dataset}-{n}")
    if n % 7 == 6:
        return [Change.delete(f"{dataset}-{rng.randrange(n)}")]
    return [
        Change.upsert(
            f"{dataset}-{n}", {"n": n, "amount": rng.randrange(1, 500), "region": rng.choice("NESW")}
        )
    ]


def seed_wal(
    wal: Any, summary: DemoSummary, progress: Progress, rows_per_dataset: int, rows: range | None = None
) -> None:
    producer = WalProducer.of(wal.wal_table())
    for dataset in DEMO_DATASETS:
        for n in rows if rows is not None else range(rows_per_dataset):
            producer.append(dataset, wal_changes(dataset, n), client_token=f"demo-{dataset}-{n}")
            progress("WAL changes", 1)


def tick_until_idle(
    sensor: str, defs: dg.Definitions, instance: dg.DagsterInstance, summary: DemoSummary
) -> list[dg.ExecuteInProcessResult]:
    """Tick a sensor, as the daemon would every interval, until a tick launches nothing; returns the runs."""
    runs: list[dg.ExecuteInProcessResult] = []
    for _ in range(MAX_TICKS):
        result = _note(
            tick_sensor(sensor, defs=defs, instance=instance, run_log_level=RUN_LOG_LEVEL), summary
        )
        runs += result.results
        if not result.results:
            break
    return runs


def flush_until_applied(
    defs: dg.Definitions, instance: dg.DagsterInstance, wal: Any, summary: DemoSummary
) -> int:
    """Tick wal_sensor as the daemon would until no WAL row is Pending; returns the flush runs.

    A shard flushed moments ago waits out its run interval, so an idle tick does not mean all is applied.
    """
    runs, table = 0, wal.wal_table()
    for _ in range(MAX_TICKS):
        runs += len(tick_until_idle("wal_sensor", defs, instance, summary))
        if not table.pending(limit=1):
            break
        time.sleep(WAL_TICK_INTERVAL_S)
    return runs


def read_datasets(wal: Any, summary: DemoSummary) -> None:
    for dataset in DEMO_DATASETS:
        reader = DatasetReader(wal.s3_client(), wal.bucket, wal.prefix, dataset)
        version, state = reader.read()
        summary.datasets[dataset] = (version, len(state))


# --- 3. Iceberg maintenance -------------------------------------------------------------------------


def create_table(spark: Any, name: str, files: int) -> None:
    """A table with `files` small data files and position deletes in several of them."""
    full = f"lake.{DEMO_NAMESPACE}.{name}"
    spark.sql(f"DROP TABLE IF EXISTS {full} PURGE")
    spark.sql(
        f"CREATE TABLE {full} (id BIGINT, kind STRING, amount DOUBLE) USING iceberg TBLPROPERTIES ("
        "'format-version'='2', 'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
        "'runstate.maintenance.enabled'='true', 'runstate.maintenance.cadence-hours'='0')"
    )
    frame = spark.range(0, files * 50).selectExpr(
        "id", "CASE WHEN id % 3 = 0 THEN 'view' ELSE 'click' END AS kind", "CAST(id % 97 AS DOUBLE) AS amount"
    )
    for chunk in range(4):  # several commits: several snapshots
        frame.where(f"id % 4 = {chunk}").repartition(files // 4).writeTo(full).append()
    spark.sql(f"DELETE FROM {full} WHERE id % 10 = 7")


def table_counts(spark: Any, name: str, full: str | None = None) -> TableCounts:
    full = full or f"lake.{DEMO_NAMESPACE}.{name}"
    files = spark.sql(f"SELECT count(*) FROM {full}.data_files").first()[0]
    snapshots = spark.sql(f"SELECT count(*) FROM {full}.snapshots").first()[0]
    deletes = spark.sql(f"SELECT count(*) FROM {full}.delete_files").first()[0]
    return TableCounts(files, snapshots, deletes)


def table_rows(spark: Any, name: str) -> list[tuple]:
    return [tuple(r) for r in spark.sql(f"SELECT * FROM lake.{DEMO_NAMESPACE}.{name} ORDER BY id").collect()]


def run_maintenance(defs: dg.Definitions, instance: dg.DagsterInstance, summary: DemoSummary) -> None:
    """The orchestrator submits jobs; the worker runs the queue sensor starts drain them (several jobs a run)."""
    # The inventory is an asset on an hourly AutomationCondition: here it runs now, before the orchestrator.
    logs = {"loggers": {"console": {"config": {"log_level": RUN_LOG_LEVEL}}}}
    inventory = execute_run(defs.resolve_job_def("table_inventory_job"), instance, run_config=logs)
    _note(TickResult(requested=1, results=[inventory]), summary)
    _note(
        tick_schedule("maintenance_orchestrator", defs=defs, instance=instance, run_log_level=RUN_LOG_LEVEL),
        summary,
    )
    workers = tick_until_idle("maintenance_queue_sensor", defs, instance, summary)
    summary.maintenance_runs += len(workers)
    summary.jobs_completed += sum(
        run.output_for_node("run_maintenance_worker")["completed"] for run in workers if run.success
    )


def seed_tables(spark: Any, summary: DemoSummary, progress: Progress, files: int) -> dict[str, list[tuple]]:
    """Create the demo tables and record their figures; returns each table's rows for the comparison."""
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{DEMO_NAMESPACE}")
    rows = {}
    for name in DEMO_TABLES:
        create_table(spark, name, files)
        summary.tables.append(TableFigures(f"{DEMO_NAMESPACE}.{name}", before=table_counts(spark, name)))
        rows[name] = table_rows(spark, name)
        progress("Iceberg tables", 1)
    return rows


def measure_tables(spark: Any, summary: DemoSummary, rows_before: dict[str, list[tuple]]) -> None:
    for figures, name in zip(summary.tables, DEMO_TABLES):
        figures.after = table_counts(spark, name)
        figures.rows_equal = table_rows(spark, name) == rows_before[name]


# --- 4. dataset tables -----------------------------------------------------------------------------

LAKE_DATASET = "orders"
MERGE_WAVES = 3


def waves(rows_per_dataset: int) -> list[range]:
    """The WAL seeding in waves, each flushed and merged, as a busy dataset's table is (the same rows and
    client tokens as one wave); a table this small is merged copy-on-write, so it gathers no delete file."""
    size = max(1, -(-rows_per_dataset // MERGE_WAVES))
    return [range(start, min(start + size, rows_per_dataset)) for start in range(0, rows_per_dataset, size)]


def measure_dataset_table(spark: Any, wal: Any, summary: DemoSummary, after: bool) -> None:
    """The dataset table's files before/after maintenance; rows_equal: its live rows are the blob reader's state."""
    counts = table_counts(spark, LAKE_DATASET, table_ident(LAKE_DATASET))
    if not after:
        summary.tables.append(TableFigures(f"datasets.{LAKE_DATASET}", before=counts))
        return
    figures = summary.tables[-1]
    figures.after = counts
    reader = DatasetReader(wal.s3_client(), wal.bucket, wal.prefix, LAKE_DATASET)
    figures.rows_equal = read_table(spark, LAKE_DATASET) == reader.read()


# --- 5. the run history in the lake --------------------------------------------------------------------

# The README's example of `runstate sql`: the lake answers what the live tables should not be asked.
FAILED_STEPS_SQL = """SELECT event_type, count(*) AS failed_steps
FROM {events}
WHERE step_id IS NOT NULL AND event_type IN ('StepFailed', 'StepRetrying')
  AND emitted_at >= current_timestamp() - INTERVAL 7 DAYS
GROUP BY event_type ORDER BY event_type"""


def export_history(
    defs: dg.Definitions, instance: dg.DagsterInstance, spark: Any, summary: DemoSummary
) -> None:
    """One run_history_sensor tick (its export run, in-process), then the question asked of the lake."""
    _note(tick_sensor("run_history_sensor", defs=defs, instance=instance), summary)
    events = summary.history_table = HistoryConfig.from_settings(settings()).events_table
    summary.history_events = spark.sql(f"SELECT count(*) FROM {events}").first()[0]
    rows = spark.sql(FAILED_STEPS_SQL.format(events=events)).collect()
    summary.failed_steps_by_type = {row.event_type: row.failed_steps for row in rows}


# --- the whole demo ---------------------------------------------------------------------------------


def run_demo(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    *,
    progress: Progress = lambda label, n: None,
    rows_per_dataset: int = 40,
    files_per_table: int = 60,
) -> DemoSummary:
    summary = DemoSummary()
    with dg.build_resources(defs.resources) as resources:  # resolves EnvVar fields outside a run
        _run_demo(defs, instance, resources, summary, progress, rows_per_dataset, files_per_table)
    return summary


def _run_demo(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: Any,
    summary: DemoSummary,
    progress: Progress,
    rows_per_dataset: int,
    files_per_table: int,
) -> None:
    store = resources.event_store.get_store()
    spark = resources.spark.get_session()

    seed_runs(store, summary, progress)
    for rows in waves(rows_per_dataset):
        seed_wal(resources.wal, summary, progress, rows_per_dataset, rows)
        summary.flush_runs += flush_until_applied(defs, instance, resources.wal, summary)
        summary.merge_runs += len(tick_until_idle("dataset_tables_sensor", defs, instance, summary))
    read_datasets(resources.wal, summary)

    rows_before = seed_tables(spark, summary, progress, files_per_table)
    measure_dataset_table(spark, resources.wal, summary, after=False)
    run_maintenance(defs, instance, summary)
    measure_tables(spark, summary, rows_before)
    measure_dataset_table(spark, resources.wal, summary, after=True)

    _note(tick_sensor("run_recorder", defs=defs, instance=instance), summary)
    summary.dagster_runs_recorded = sum(
        1 for run_id in store.run_ids(limit=10_000) if run_id not in summary.seeded_runs
    )
    export_history(defs, instance, spark, summary)


def render(summary: DemoSummary) -> str:
    lines = ["", "runstate demo: summary", "=" * 72]
    lines.append(
        f"run state store   events appended {summary.events_appended} "
        f"(idempotent re-sends {summary.events_idempotent})"
    )
    for run_id, status in summary.runs_projected.items():
        lines.append(f"                  {run_id:<28} {status}")
    lines.append(f"                  Dagster runs recorded by run_recorder: {summary.dagster_runs_recorded}")
    lines.append(f"dataset WAL       flush runs {summary.flush_runs}")
    for dataset, (version, keys) in summary.datasets.items():
        lines.append(f"                  {dataset:<12} version {version:<6} keys {keys}")
    lines.append(
        f"dataset tables    merge runs {summary.merge_runs} (lake.datasets.<dataset>, live rows: WHERE NOT deleted)"
    )
    lines.append(
        f"maintenance       worker runs {summary.maintenance_runs}, jobs completed {summary.jobs_completed}"
    )
    lines.append(
        f"                  {'table':<18}{'files':>14}{'snapshots':>14}{'delete files':>16}  rows equal"
    )
    for t in summary.tables:
        lines.append(
            f"                  {t.table:<18}{t.before.files:>6} -> {t.after.files:<5}{t.before.snapshots:>6} -> "
            f"{t.after.snapshots:<5}{t.before.delete_files:>7} -> {t.after.delete_files:<6}  {t.rows_equal}"
        )
    failed = ", ".join(f"{kind} {n}" for kind, n in summary.failed_steps_by_type.items()) or "none"
    lines.append(f"run history       {summary.history_events} events in {summary.history_table}")
    lines.append(f"                  failed steps per event type, last 7 days: {failed}")
    lines.append(f'                  ask it yourself: runstate sql "SELECT ... FROM {summary.history_table}"')
    if summary.failed_runs:
        lines.append(f"FAILED RUNS: {', '.join(summary.failed_runs)} (see them in the UI)")
    lines.append("=" * 72)
    lines.append("Open the UI on the same services with:  runstate dev   (then http://127.0.0.1:3000)")
    return "\n".join(lines)
