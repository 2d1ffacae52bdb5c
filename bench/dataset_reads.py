"""Benchmark: a dataset table stays fast to read. Prints ONE JSON line.

Three tables with the same final rows, each read by a full scan (every live row's value) and by point
lookups (one key each), with its data and delete files:
- `merged`: a dataset table (runstate.wal.dataset_tables' DDL and MERGE: newer wal_seq wins, the `#version`
  row updated by every merge, the write mode its size calls for after each commit: copy-on-write up to
  --cow-max-bytes) after --merges small merges of --changes changes each (--initial-keys: on a table
  holding that many keys already);
- `maintained`: that table after the maintenance service ran on it (the orchestrator's decision, then a
  worker, until the orchestrator submits nothing);
- `baseline`: the same rows written once.
Floor: maintained_scan_s <= 1.2 x baseline_scan_s and maintained_delete_files == 0.
With --apply-deletes-at N: instead, a busy table between maintenance cycles under apply_deletes_sensor's
rule (apply_deletes_cycles); goal: never past 2x the same rows written once.
Times are medians of --reads reads. Records the 1-minute load at start and end (`"quiet": false` when
it was above 1.0 at the start: then the ratios are not results). Own database and warehouse.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import create_database, drop_database, load_end, load_start  # noqa: E402
from runstate.wal.dataset_tables.table import COPY_ON_WRITE_MAX_BYTES, table_files  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
NAMESPACE = "bench"
SCAN_SQL = "SELECT count(*) AS n, sum(length(value)) AS chars FROM {t} WHERE NOT deleted"
LOOKUP_SQL = "SELECT value FROM {t} WHERE key = '{key}'"


def key_text(n: int) -> str:
    return json.dumps(f"k{n}")  # keys are JSON text in dataset tables


def merge_changes(
    spark, ident: str, seqs: range, changes: int, keys: int, rng: random.Random, cow_max_bytes: int
) -> None:
    """One MERGE per seq of `changes` upserts/deletes each (one in ten a delete), as the WAL merge makes them,
    each followed by the merge's choice of write mode for the next one (table.write_mode)."""
    from runstate.wal.dataset_tables.merge import merge_statement
    from runstate.wal.dataset_tables.table import (
        set_version_property,
        table_files,
        table_properties,
        write_mode_change,
    )

    statement = merge_statement(ident, "changes", SimpleNamespace(full=False, rebuild=False))
    for seq in seqs:
        rows = [("#version", None, seq, True)]
        for _ in sorted({rng.randrange(keys) for _ in range(changes)}):
            key = key_text(_)
            deleted = rng.random() < 0.1
            rows.append((key, None if deleted else json.dumps({"seq": seq, "w": rng.random()}), seq, deleted))
        frame = spark.createDataFrame(rows, "key STRING, value STRING, wal_seq BIGINT, deleted BOOLEAN")
        frame.createOrReplaceTempView("changes")
        spark.sql(statement)
        mode = write_mode_change(
            table_properties(spark, ident), table_files(spark, ident).bytes, cow_max_bytes
        )
        if mode is not None:
            set_version_property(spark, ident, seq, mode)


def create_table(spark, ident: str, initial_keys: int = 0) -> None:
    """A dataset table; with `initial_keys`, holding that many keys already (written once)."""
    from runstate.wal.dataset_tables.table import COLUMNS, TABLE_PROPERTIES

    properties = ", ".join(f"'{k}'='{v}'" for k, v in TABLE_PROPERTIES.items())
    spark.sql(f"CREATE TABLE {ident} ({COLUMNS}) USING iceberg TBLPROPERTIES ({properties})")
    if initial_keys:
        spark.sql(
            f"INSERT INTO {ident} SELECT concat('\"k', id, '\"') AS key,"
            " to_json(named_struct('seq', 0, 'w', rand(7))) AS value, 0L AS wal_seq,"
            f" current_timestamp() AS updated_at, false AS deleted FROM range({int(initial_keys)})"
        )


def reads(spark, ident: str, repeats: int, keys: int) -> dict:
    from runstate.maintenance.figures import table_figures
    from runstate.maintenance.identifiers import TableRef

    scans, lookups = [], []
    for i in range(repeats):
        began = time.perf_counter()
        spark.sql(SCAN_SQL.format(t=ident)).collect()
        scans.append(time.perf_counter() - began)
        began = time.perf_counter()
        spark.sql(LOOKUP_SQL.format(t=ident, key=key_text(i * 7919 % keys))).collect()
        lookups.append(time.perf_counter() - began)
    figures = table_figures(spark, TableRef(NAMESPACE, ident.rsplit(".", 1)[1]))
    return {
        "scan_s": round(statistics.median(scans), 4),
        "lookup_s": round(statistics.median(lookups), 4),
        "data_files": figures["data_files"],
        "delete_files": figures["delete_files"],
        "rows": spark.sql(SCAN_SQL.format(t=ident)).first()["n"],
    }


def maintain(spark, dsn: str, table: str, cycles: int) -> list[list[str]]:
    """The maintenance service's own path: orchestrator (health, rules, submit), then one worker."""
    from runstate.maintenance import HealthAnalyzer, MaintenanceStore, Orchestrator, OrchestratorSettings
    from runstate.maintenance.models import CachedTable
    from runstate.maintenance.runner import QueueWorker

    submitted = []
    with MaintenanceStore(dsn, schema="bench") as store:
        store.ensure_schema()
        store.cache.replace_table_cache([CachedTable(NAMESPACE, table, True, {})])
        settings = OrchestratorSettings(default_cadence_hours=0)
        for _ in range(cycles):
            report = Orchestrator(store, HealthAnalyzer(spark).analyze, settings).run()
            jobs = [d.recommended_actions for d in report.decisions if d.job_id]
            if not jobs:
                break
            submitted.extend(jobs)
            done = QueueWorker(store, "bench", lease_seconds=600).drain(spark, budget_seconds=3600)
            failed = [o.error for o in done.outcomes if o.status != "completed"]
            assert not failed, failed
    return submitted


def apply_deletes_cycles(spark, dsn: str, args: argparse.Namespace) -> dict:
    """A busy dataset table under apply_deletes_sensor's rule: once a merge leaves --apply-deletes-at
    delete files, --lag-merges more merges land (the sensor's and the worker run's start, at one merge a
    minute), then the job the sensor submits runs. Each time, just before that job (the table at its
    worst), its scan is compared with the same rows written once."""
    from runstate.maintenance import MaintenanceStore
    from runstate.maintenance.identifiers import APPLY_DELETES_ACTIONS, APPLY_DELETES_OPTIONS
    from runstate.maintenance.models import CachedTable
    from runstate.maintenance.runner import QueueWorker

    busy, rng, ratios, peaks, seq = f"lake.{NAMESPACE}.busy", random.Random(11), [], [], 0
    create_table(spark, busy, args.initial_keys)
    with MaintenanceStore(dsn, schema="bench") as store:
        store.ensure_schema()
        store.cache.add_cached_table(CachedTable(NAMESPACE, "busy", True))
        while seq < args.merges:
            seq += 1
            merge_changes(spark, busy, range(seq, seq + 1), args.changes, args.keys, rng, args.cow_max_bytes)
            if seq == 1:  # the session's first reads are slower (class loading, JIT): not the table's
                reads(spark, busy, args.reads, args.keys)
            if table_files(spark, busy).delete_files < args.apply_deletes_at:
                continue
            merge_changes(
                spark,
                busy,
                range(seq + 1, seq + 1 + args.lag_merges),
                args.changes,
                args.keys,
                rng,
                args.cow_max_bytes,
            )
            seq += args.lag_merges
            base = f"lake.{NAMESPACE}.busy_base_{len(ratios)}"
            create_table(spark, base)
            spark.sql(f"INSERT INTO {base} SELECT * FROM {busy}")
            written_once = reads(spark, base, args.reads, args.keys)
            worst = reads(spark, busy, args.reads, args.keys)
            ratios.append(round(worst["scan_s"] / written_once["scan_s"], 2))
            peaks.append(worst["delete_files"])
            store.submit(NAMESPACE, "busy", APPLY_DELETES_ACTIONS, options=APPLY_DELETES_OPTIONS)
            done = QueueWorker(store, "bench", lease_seconds=600).drain(spark, budget_seconds=3600)
            assert all(o.status == "completed" for o in done.outcomes), done.outcomes
            assert table_files(spark, busy).delete_files == 0
    return {
        "apply_deletes_at": args.apply_deletes_at,
        "lag_merges": args.lag_merges,
        "cycle_scan_vs_baseline": ratios,
        "cycle_peak_delete_files": peaks,
        "max_scan_vs_baseline": max(ratios, default=None),
        "goal_2x_met": bool(ratios) and max(ratios) <= 2.0,
    }


def written_merged_maintained(spark, dsn: str, args: argparse.Namespace) -> dict:
    """The three tables of the module docstring: the same rows written once, merged, then maintained."""
    result: dict = {}
    merged, baseline = f"lake.{NAMESPACE}.merged", f"lake.{NAMESPACE}.baseline"
    create_table(spark, merged, args.initial_keys)
    began = time.perf_counter()
    merge_changes(
        spark,
        merged,
        range(1, args.merges + 1),
        args.changes,
        args.keys,
        random.Random(7),
        args.cow_max_bytes,
    )
    result["merge_s"] = round(time.perf_counter() - began, 1)
    create_table(spark, baseline)
    spark.sql(f"INSERT INTO {baseline} SELECT * FROM {merged}")
    for label, ident in (("baseline", baseline), ("merged", merged)):
        result.update({f"{label}_{k}": v for k, v in reads(spark, ident, args.reads, args.keys).items()})
    result["maintenance_jobs"] = maintain(spark, dsn, "merged", args.cycles)
    result.update({f"maintained_{k}": v for k, v in reads(spark, merged, args.reads, args.keys).items()})
    assert result["maintained_rows"] == result["baseline_rows"] == result["merged_rows"]
    for label in ("merged", "maintained"):
        result[f"{label}_scan_vs_baseline"] = round(result[f"{label}_scan_s"] / result["baseline_scan_s"], 2)
    result["floor_met"] = (
        result["maintained_scan_vs_baseline"] <= 1.2 and result["maintained_delete_files"] == 0
    )
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--merges", type=int, default=200)
    parser.add_argument("--changes", type=int, default=20, help="changes per merge")
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--reads", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=3, help="maintenance cycles at most")
    parser.add_argument("--admin-url", default=ADMIN_URL)
    parser.add_argument(
        "--apply-deletes-at",
        type=int,
        default=0,
        help="instead: --merges merges under apply_deletes_sensor's rule at this many delete files",
    )
    parser.add_argument("--lag-merges", type=int, default=2, help="merges between the rule and its job")
    parser.add_argument(
        "--cow-max-bytes",
        type=int,
        default=COPY_ON_WRITE_MAX_BYTES,
        help="the merges' copy-on-write limit (0: every merge on read)",
    )
    parser.add_argument("--initial-keys", type=int, default=0, help="keys the table holds before the merges")
    args = parser.parse_args(argv)
    result: dict = {
        "bench": "dataset_reads",
        "merges": args.merges,
        "changes": args.changes,
        "initial_keys": args.initial_keys,
        "cow_max_bytes": args.cow_max_bytes,
        **load_start(),
    }
    from runstate.spark import SparkSettings, build_session

    name, dsn = create_database(args.admin_url)
    warehouse = Path(tempfile.mkdtemp(prefix="rs_bench_reads_"))
    spark = build_session(
        SparkSettings(
            pg_url=dsn,
            warehouse_dir=warehouse,
            app_name="runstate-bench-reads",
            extra_conf={"spark.ui.showConsoleProgress": "false"},
        )
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{NAMESPACE}")
        result.update(
            written_merged_maintained(spark, dsn, args)
            if not args.apply_deletes_at
            else apply_deletes_cycles(spark, dsn, args)
        )
    finally:
        spark.stop()
        shutil.rmtree(warehouse, ignore_errors=True)
        drop_database(args.admin_url, name)
    result.update(load_end())
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
