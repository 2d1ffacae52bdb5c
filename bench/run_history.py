"""Benchmark of the run history in the lake: the export's events per second on Spark local[2], beside a
bare Spark INSERT INTO of the same rows in the same session; with --lag, the lag from an append to the
event being in the lake, through `runstate dev` (its sensor, queue, run worker and export).

Prints ONE JSON line:
- export mode: export_events_per_s (`export_history` from the Postgres feed: the conditional Iceberg
  commits of --batch-events each, read by Spark's JDBC source, and the runs merge, with the seconds of
  each part), insert_events_per_s (the same rows, cached in Spark, written by `INSERT INTO` into a table
  of the same schema and partitioning: the floor of any write of them), export_over_insert (goal: at
  least 0.7), commits_over_insert (run_events alone), and commits_over_jdbc_copy (beside a CREATE TABLE AS
  SELECT of run_events as Spark's JDBC source reads it: the raw floor of a copy out of Postgres); each
  the median of --rounds exports of the whole feed, each into tables of its own, beside its baselines;
- --lag: lag_p50_s, lag_p99_s and lag_max_s of --lag-appends events appended --lag-every seconds apart,
  each from its append until pyiceberg reads the lake at or past its feed position, beside
  goal_p99_s = 2 x RUNSTATE_HISTORY_EXPORT_INTERVAL_S (--interval).
- --steady: export_s and runs_merge_s of an export of one new event of each of --touch runs (created
  today) when the runs table holds --runs-table runs created over the past year, beside the same at 1,000
  runs, and merge_growth (their ratio): a merge reads the partitions of its runs' creation days only, so
  this should stay near 1 as the table grows (medians of three exports).
All record the 1-minute load at start and end; "quiet" is false when it was above 1.0 at the start.

Usage: python bench/run_history.py [--events N --runs N --batch-events N --rounds N]
       python bench/run_history.py --lag [--interval S --lag-appends N --lag-every S]
       python bench/run_history.py --steady [--runs-table N --touch N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.common import create_database, drop_database, load_end, load_start  # noqa: E402

ADMIN_URL = os.environ.get("RUNSTATE_BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
TYPES = ("RunStarted", "StepStarted", "StepCompleted", "StepFailed", "ArtifactEmitted", "RunCompleted")
APPEND_BATCH = 100


def load_events(store: Any, events: int, runs: int, seed: int = 7) -> None:
    """`events` events over `runs` runs, appended in batches of APPEND_BATCH per run."""
    from runstate.eventstore import NewEvent

    rng = random.Random(seed)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for offset in range(0, events, APPEND_BATCH):
        run_id = f"bench-run-{rng.randrange(runs):05d}"
        batch = [
            NewEvent(
                run_id=run_id,
                event_type=rng.choice(TYPES),
                emitted_at=start + timedelta(seconds=offset + n),
                step_id=f"step-{rng.randrange(20)}",
                data={"rows": rng.randrange(10_000), "note": "x" * rng.randrange(64)},
                idempotency_key=uuid.uuid4().hex,
            )
            for n in range(min(APPEND_BATCH, events - offset))
        ]
        store.append_batch(run_id, batch)


def export_vs_insert(args: argparse.Namespace) -> dict[str, Any]:
    from runstate.eventstore import PostgresEventStore
    from runstate.eventstore.lake import HistoryConfig, export_history
    from runstate.eventstore.lake.arrow import EVENT_DDL
    from runstate.spark import SparkSettings, build_session

    name, dsn = create_database(ADMIN_URL)
    warehouse = Path(tempfile.mkdtemp(prefix="runstate-bench-lake-"))
    store = PostgresEventStore(dsn, schema="runstate")
    batch_events = args.batch_events or HistoryConfig.batch_events
    try:
        store.ensure_schema()
        load_events(store, args.events, args.runs)
        spark = build_session(
            SparkSettings(pg_url=dsn, warehouse_dir=warehouse, app_name="bench-run-history")
        )
        spark.sparkContext.setLogLevel("ERROR")
        # Warm the JVM on every path (a first Spark job pays for class loading and the JIT).
        warm = HistoryConfig(namespace="bench_warm", batch_events=1000)
        list(export_history(spark, store, warm, once=True))
        _insert(spark, warm.events_table, "lake.bench_warm.copy", EVENT_DDL)
        _jdbc_copy(spark, dsn, "lake.bench_warm.raw_copy")
        rounds = [_round(spark, store, dsn, batch_events, n) for n in range(args.rounds)]
        spark.stop()
    finally:
        store.close()
        drop_database(ADMIN_URL, name)
        shutil.rmtree(warehouse, ignore_errors=True)
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    exported = median["events"]
    return {
        "events": exported,
        "runs": args.runs,
        "batch_events": batch_events,
        "rounds": args.rounds,
        "commits": median["commits"],
        "export_s": round(median["export_s"], 2),
        "events_commit_s": round(median["commit_s"], 2),
        "runs_merge_s": round(median["merge_s"], 2),
        # The rest: the feed's bounds and the tables' positions.
        "bounds_and_positions_s": round(median["export_s"] - median["commit_s"] - median["merge_s"], 2),
        "export_events_per_s": round(exported / median["export_s"]),
        "insert_s": round(median["insert_s"], 2),
        "insert_events_per_s": round(exported / median["insert_s"]),
        "export_over_insert": round(median["insert_s"] / median["export_s"], 3),
        "goal": 0.7,
        # run_events alone (the commits, without the runs merge) against the same insert.
        "commits_over_insert": round(median["insert_s"] / median["commit_s"], 3),
        # The raw floor of any copy out of Postgres: Spark's JDBC source on run_events as it is (key
        # bytes, no conversion), written by CREATE TABLE AS SELECT.
        "jdbc_copy_s": round(median["jdbc_s"], 2),
        "commits_over_jdbc_copy": round(median["jdbc_s"] / median["commit_s"], 3),
    }


def _round(spark: Any, store: Any, dsn: str, batch_events: int, n: int) -> dict[str, float]:
    """One export of the whole feed into a namespace of its own, then the two baselines of it; seconds."""
    from runstate.eventstore.lake import EventsCommitted, HistoryConfig, export_history
    from runstate.eventstore.lake.arrow import EVENT_DDL

    history = HistoryConfig(namespace=f"bench_{n}", batch_events=batch_events)
    began = time.perf_counter()
    steps = list(export_history(spark, store, history))
    export_s = time.perf_counter() - began
    commits = [step for step in steps if isinstance(step, EventsCommitted)]
    return {
        "events": sum(step.events for step in commits),
        "commits": len(commits),
        "export_s": export_s,
        "commit_s": sum(step.seconds for step in commits),
        "merge_s": sum(step.seconds for step in steps if not isinstance(step, EventsCommitted)),
        "insert_s": _insert(spark, history.events_table, f"lake.bench_{n}.bare_insert", EVENT_DDL),
        "jdbc_s": _jdbc_copy(spark, dsn, f"lake.bench_{n}.raw_copy"),
    }


def _insert(spark: Any, source: str, target: str, ddl: str) -> float:
    """Seconds of `INSERT INTO target SELECT * FROM` the source's rows, cached in Spark beforehand."""
    spark.sql(
        f"CREATE TABLE {target} ({ddl}) USING iceberg PARTITIONED BY (days(emitted_at)) "
        "TBLPROPERTIES ('format-version'='2')"
    )
    rows = spark.table(source).cache()
    rows.count()
    rows.createOrReplaceTempView("bench_rows")
    began = time.perf_counter()
    spark.sql(f"INSERT INTO {target} SELECT * FROM bench_rows")
    seconds = time.perf_counter() - began
    rows.unpersist()
    return seconds


def _jdbc_copy(spark: Any, dsn: str, target: str) -> float:
    """Seconds of a CREATE TABLE AS SELECT of run_events as Spark's JDBC source reads it, in one
    partition per core over the positions."""
    from runstate.spark import jdbc_url

    url, user, password = jdbc_url(dsn)
    connection = {"driver": "org.postgresql.Driver", "url": url, "user": user or "postgres"}
    if password:
        connection["password"] = password
    bounds = (
        spark.read.format("jdbc")
        .options(
            **connection, query="SELECT min(position) AS lo, max(position) AS hi FROM runstate.run_events"
        )
        .load()
        .first()
    )
    rows = (
        spark.read.format("jdbc")
        .options(**connection, fetchsize="10000", dbtable="runstate.run_events", partitionColumn="position")
        .options(numPartitions=str(spark.sparkContext.defaultParallelism))
        .options(lowerBound=str(bounds.lo), upperBound=str(bounds.hi + 1))
        .load()
    )
    rows.createOrReplaceTempView("bench_raw_rows")
    began = time.perf_counter()
    spark.sql(
        f"CREATE TABLE {target} USING iceberg PARTITIONED BY (days(emitted_at)) AS SELECT * FROM bench_raw_rows"
    )
    return time.perf_counter() - began


def steady_export(args: argparse.Namespace) -> dict[str, Any]:
    """The export of one new event of each of --touch runs when `runs` holds --runs-table runs, beside the
    same export when it holds 1,000: what a merge's reads of the whole runs table cost as it grows."""
    from runstate.eventstore import PostgresEventStore
    from runstate.spark import SparkSettings, build_session

    name, dsn = create_database(ADMIN_URL)
    warehouse = Path(tempfile.mkdtemp(prefix="runstate-bench-lake-"))
    store = PostgresEventStore(dsn, schema="runstate")
    try:
        store.ensure_schema()
        spark = build_session(
            SparkSettings(pg_url=dsn, warehouse_dir=warehouse, app_name="bench-run-history")
        )
        spark.sparkContext.setLogLevel("ERROR")
        seconds = {
            size: _steady_round(spark, store, f"steady_{size}", size, args.touch)
            for size in (1_000, args.runs_table)
        }
        spark.stop()
    finally:
        store.close()
        drop_database(ADMIN_URL, name)
        shutil.rmtree(warehouse, ignore_errors=True)
    small, large = seconds[1_000], seconds[args.runs_table]
    return {
        "mode": "steady_export",
        "touched_runs": args.touch,
        "runs_table_rows": args.runs_table,
        "export_s": round(large["export_s"], 2),
        "runs_merge_s": round(large["merge_s"], 2),
        "export_s_at_1000_runs": round(small["export_s"], 2),
        "runs_merge_s_at_1000_runs": round(small["merge_s"], 2),
        "merge_growth": round(large["merge_s"] / small["merge_s"], 2),
    }


def _steady_round(spark: Any, store: Any, namespace: str, rows: int, touch: int) -> dict[str, float]:
    """Exports `touch` runs, pads runs with synthetic rows (20 steps each, one creation day of the past
    365 each) up to `rows`, then times the
    export of one more event of each touched run (the median of three such exports)."""
    from runstate.eventstore import NewEvent
    from runstate.eventstore.lake import EventsCommitted, HistoryConfig, export_history

    history = HistoryConfig(namespace=namespace)
    run_ids = [f"{namespace}-run-{n}" for n in range(touch)]

    def append_and_export() -> dict[str, float]:
        for run_id in run_ids:
            event = NewEvent(
                run_id=run_id,
                event_type="StepStarted",
                step_id="s",
                emitted_at=datetime.now(UTC),
                idempotency_key=uuid.uuid4().hex,  # the default key is the event's content: a repeat
            )
            store.append(event)
        began = time.perf_counter()
        steps = list(export_history(spark, store, history))
        merge_s = sum(step.seconds for step in steps if not isinstance(step, EventsCommitted))
        return {"export_s": time.perf_counter() - began, "merge_s": merge_s}

    append_and_export()
    spark.sql(
        f"INSERT INTO {history.runs_table} SELECT concat('pad-', id), "
        "current_timestamp() - make_interval(0, 0, 0, CAST(id % 365 AS INT)), 'COMPLETED', current_timestamp(), "
        "current_timestamp(), current_timestamp(), current_timestamp(), 60.0D, 100L, array(), 100L, 1L, "
        "map_from_arrays(transform(sequence(1, 20), i -> concat('step-', i)), "
        "transform(sequence(1, 20), i -> named_struct('status', 'SUCCESS', 'starts', 1L, 'seq', CAST(i AS BIGINT)))), "
        "named_struct('terminal_seq', 100L, 'started_seq', 1L, 'lifecycle_seq', 1L, 'lifecycle_event', 'RunStarted', "
        f"'activated', true) FROM range({max(0, rows - touch)})"
    )
    rounds = [append_and_export() for _ in range(3)]
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def lag_through_dev(args: argparse.Namespace) -> dict[str, Any]:
    from wal_devserver import percentile, start_dev

    from runstate.eventstore import NewEvent, PostgresEventStore
    from runstate.eventstore.lake import HistoryCatalog, LakeRunReader

    os.environ["RUNSTATE_HISTORY_EXPORT_INTERVAL_S"] = str(args.interval)
    dev_context = start_dev()
    dev = next(dev_context)
    try:
        store = PostgresEventStore(dev.env["RUNSTATE_PG_URL"], schema="runstate")
        reader = LakeRunReader(
            HistoryCatalog(dev.env["RUNSTATE_PG_URL"], dev.home / ".runstate" / "warehouse")
        )
        pending: dict[int, float] = {}  # feed position -> when its event was appended
        lags: list[float] = []
        next_append = time.monotonic()
        deadline = time.monotonic() + args.lag_appends * args.lag_every + args.timeout
        appended = 0
        while (appended < args.lag_appends or pending) and time.monotonic() < deadline:
            if appended < args.lag_appends and time.monotonic() >= next_append:
                run_id = f"lag-{uuid.uuid4().hex[:8]}"
                store.append(NewEvent(run_id=run_id, event_type="RunStarted", emitted_at=datetime.now(UTC)))
                pending[store.fetch(run_id)[0].position] = time.monotonic()
                appended, next_append = appended + 1, next_append + args.lag_every
            reached = reader.position()
            for position in [p for p in pending if p <= reached]:
                lags.append(time.monotonic() - pending.pop(position))
            time.sleep(0.5)
        reader.catalog.close()
        store.close()
    finally:
        dev_context.close()
    if pending:
        raise SystemExit(f"{len(pending)} of {args.lag_appends} appended events never reached the lake")
    return {
        "mode": "lag_through_runstate_dev",
        "appends": len(lags),
        "export_interval_s": args.interval,
        "lag_p50_s": round(percentile(lags, 0.5), 2),
        "lag_p99_s": round(percentile(lags, 0.99), 2),
        "lag_max_s": round(max(lags), 2),
        "goal_p99_s": 2 * args.interval,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=2_000)
    parser.add_argument(
        "--batch-events",
        type=int,
        default=None,
        help="Events per commit (default: RUNSTATE_HISTORY_BATCH_EVENTS's).",
    )
    parser.add_argument("--rounds", type=int, default=3, help="Exports (each beside its baselines); medians.")
    parser.add_argument("--lag", action="store_true", help="Measure the lag through runstate dev instead.")
    parser.add_argument(
        "--steady", action="store_true", help="Measure an export of --touch runs beside a runs table's size."
    )
    parser.add_argument("--runs-table", type=int, default=500_000, help="--steady: rows in the runs table.")
    parser.add_argument("--touch", type=int, default=20, help="--steady: runs with a new event per export.")
    parser.add_argument("--interval", type=int, default=60, help="--lag: RUNSTATE_HISTORY_EXPORT_INTERVAL_S.")
    parser.add_argument("--lag-appends", type=int, default=20)
    parser.add_argument("--lag-every", type=float, default=15.0)
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="--lag: seconds allowed after the appends."
    )
    args = parser.parse_args()
    result: dict[str, Any] = {"bench": "run_history", **load_start()}
    if args.lag:
        result.update(lag_through_dev(args))
    elif args.steady:
        result.update(steady_export(args))
    else:
        result.update(export_vs_insert(args))
    result.update(load_end())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
