"""An export in a process of its own, for the tests to SIGKILL: its driver and JVM together.

Run as a script, it builds a Spark session on the test's catalog and warehouse, prints EXPORTING, then
exports the test's store, printing the name of each step as it lands (EventsCommitted, RunsMerged) and
DONE at the end; with `hold_after` it stops after the first step of that name, to be killed there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from runstate_tests.wal.dataset_tables.killing import REPO, MergeChild


class ExportChild(MergeChild):
    """The child process; `kill()` ends its whole process group (Python driver and JVM) with SIGKILL."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "runstate_tests.eventstore.lake.export_child", json.dumps(args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            start_new_session=True,
        )


def _child(args: dict[str, Any]) -> None:
    from runstate.eventstore import PostgresEventStore
    from runstate.eventstore.lake import HistoryConfig, export_history
    from runstate.spark import SparkSettings, build_session

    spark = build_session(
        SparkSettings(
            pg_url=args["catalog_url"],
            warehouse_dir=Path(args["warehouse"]),
            app_name="runstate-export-child",
        )
    )
    spark.sparkContext.setLogLevel("OFF")
    store = PostgresEventStore(args["store_url"], schema=args["schema"])
    config = HistoryConfig(namespace=args["namespace"], batch_events=args["batch_events"])
    print("EXPORTING", flush=True)
    for step in export_history(spark, store, config):
        print(type(step).__name__, flush=True)
        if type(step).__name__ == args.get("hold_after"):
            break
    else:
        print("DONE", flush=True)
    time.sleep(600)  # wait to be killed: the test decides when this process ends


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
