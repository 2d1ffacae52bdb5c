"""A maintenance worker in a process of its own (its own JVM), for the crash and zombie tests.

    python worker_process.py DSN SCHEMA WAREHOUSE LEASE_SECONDS [SPARK_JSON]

It starts Spark, claims one job, prints {"job_id", "attempt_id"} as one JSON line, runs the job with
run_job and prints the outcome as a second JSON line. The tests SIGKILL or SIGSTOP it in between.
SPARK_JSON overrides the SparkSettings (the cluster tests give a `spark://` master and extra_conf).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(dsn: str, schema: str, warehouse: str, lease_seconds: str, spark_json: str = "{}") -> None:
    from runstate.maintenance.runner import run_job
    from runstate.maintenance.store import MaintenanceStore
    from runstate.spark import SparkSettings, build_session

    spark = build_session(
        SparkSettings(
            **{
                "master": "local[1]",
                "pg_url": dsn,
                "warehouse_dir": Path(warehouse),
                "app_name": "runstate-test-worker",
                **json.loads(spark_json),
            }
        )
    )
    spark.sparkContext.setLogLevel("ERROR")
    store = MaintenanceStore(dsn, schema=schema)
    claim = store.claim("worker-process", lease_seconds=float(lease_seconds))
    if claim is None:
        print(json.dumps({"error": "nothing to claim"}), flush=True)
        return
    print(json.dumps({"job_id": claim.job_id, "attempt_id": claim.attempt_id}), flush=True)
    outcome = run_job(spark, store, claim)
    errors = [result.error for result in outcome.results if result.error]
    print(json.dumps({"status": outcome.status, "error": outcome.error, "action_errors": errors}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:6])
