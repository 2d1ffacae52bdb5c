"""The child of the frozen-worker test (`python -m runstate_tests.defs.spark_worker_child HOME RUN_ID`):
beat for RUN_ID on the instance at HOME as a run worker does, start a PySpark session (its JVM a child of
this process), print SPARK once a Spark job runs, and keep that job running until the process is ended."""

import sys
import threading
import time

import dagster as dg
from pyspark.sql import SparkSession

from runstate.defs.runs.heartbeat import heartbeat


def main(home: str, run_id: str) -> None:
    with (
        dg.DagsterInstance.from_config(home) as instance,
        heartbeat(instance, run_id, ends_run=False, worker=True),
    ):
        spark = (
            SparkSession.builder.master("local[1]")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        job = threading.Thread(
            target=lambda: spark.range(0, 10**13, numPartitions=1).selectExpr("sum(id)").collect(),
            daemon=True,
        )
        job.start()
        while not spark.sparkContext.statusTracker().getActiveJobsIds():
            time.sleep(0.1)
        print("SPARK", flush=True)
        job.join()


if __name__ == "__main__":
    main(*sys.argv[1:3])
