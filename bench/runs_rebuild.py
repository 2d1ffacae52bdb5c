"""Benchmark of the runs table's rebuild: the first export after the `runs` table is gone (dropped, or of
an older layout, which an export replaces by an empty one), which merges it again from the whole of
run_events.

Prints ONE JSON line: rebuild_s (that export: nothing new to commit, every run merged again) beside
first_export_s (the first export of the same history, events and runs together, in the same session),
with the rows the rebuilt table holds and the sum of their event_count (which must equal --events).
"quiet" is false when the 1-minute load was above 1.0 at the start.

Usage: python bench/runs_rebuild.py [--events N --runs N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.common import create_database, drop_database, load_end, load_start  # noqa: E402
from bench.run_history import ADMIN_URL, load_events  # noqa: E402


def rebuild(events: int, runs: int) -> dict[str, Any]:
    from runstate.eventstore import PostgresEventStore
    from runstate.eventstore.lake import HistoryConfig, RunsMerged, export_history
    from runstate.spark import SparkSettings, build_session

    name, dsn = create_database(ADMIN_URL)
    warehouse = Path(tempfile.mkdtemp(prefix="runstate-bench-lake-"))
    store = PostgresEventStore(dsn, schema="runstate")
    history = HistoryConfig(namespace="rebuild")
    try:
        store.ensure_schema()
        load_events(store, events, runs)
        spark = build_session(SparkSettings(pg_url=dsn, warehouse_dir=warehouse, app_name="bench-rebuild"))
        first_export_s = _timed(lambda: list(export_history(spark, store, history)))[0]
        spark.sql(f"DROP TABLE {history.runs_table}")
        rebuild_s, steps = _timed(lambda: list(export_history(spark, store, history)))
        rows, counted = spark.sql(f"SELECT count(*), sum(event_count) FROM {history.runs_table}").first()
        spark.stop()
    finally:
        store.close()
        drop_database(ADMIN_URL, name)
        shutil.rmtree(warehouse, ignore_errors=True)
    return {
        "events": events,
        "runs": runs,
        "first_export_s": round(first_export_s, 1),
        "rebuild_s": round(rebuild_s, 1),
        "merges": sum(isinstance(step, RunsMerged) for step in steps),
        "runs_rows": rows,
        "event_count_sum": counted,
    }


def _timed(work: Any) -> tuple[float, Any]:
    began = time.perf_counter()
    result = work()
    return time.perf_counter() - began, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2_000)
    args = parser.parse_args()
    start = load_start()
    print(json.dumps({"bench": "runs_rebuild", **start, **rebuild(args.events, args.runs), **load_end()}))


if __name__ == "__main__":
    main()
