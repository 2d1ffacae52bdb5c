"""A maintenance worker in a process of its own (its own JVM), for the crash and zombie tests.

    python worker_process.py DSN WAREHOUSE [SPARK_JSON]

It starts Spark once and then serves one job per line read on stdin, as a worker run keeps one JVM
across jobs: a line {"schema", "lease_seconds"} makes it claim a job of that schema, print
{"job_id", "attempt_id", "worker"} as one JSON line, run the job with run_job and print the outcome as a second
JSON line. The tests SIGKILL or SIGSTOP it in between. It exits at the end of its input.
SPARK_JSON overrides the SparkSettings (the cluster tests give a `spark://` master and extra_conf).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(dsn: str, warehouse: str, spark_json: str = "{}") -> None:
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
    for line in sys.stdin:
        request = json.loads(line)
        serve_one_job(spark, dsn, request["schema"], float(request["lease_seconds"]))


def serve_one_job(spark, dsn: str, schema: str, lease_seconds: float) -> None:
    from runstate.maintenance.runner import run_job
    from runstate.maintenance.store import MaintenanceStore

    with MaintenanceStore(dsn, schema=schema) as store:
        claim = store.claim("worker-process", lease_seconds=lease_seconds)
        if claim is None:
            print(json.dumps({"error": "nothing to claim"}), flush=True)
            return
        print(
            json.dumps({"job_id": claim.job_id, "attempt_id": claim.attempt_id, "worker": claim.worker}),
            flush=True,
        )
        outcome = run_job(spark, store, claim)
    errors = [result.error for result in outcome.results if result.error]
    print(json.dumps({"status": outcome.status, "error": outcome.error, "action_errors": errors}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
