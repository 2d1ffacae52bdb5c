"""Spark and Iceberg helpers of the tests."""

from __future__ import annotations

import shutil
from pathlib import Path

# Every Spark driver the suite starts (each worker's session, CLI commands, the demo, the deployment's runs,
# all of which inherit this variable through spark-submit) lives seconds to minutes, and spends much of its
# CPU in the JIT's second tier and parallel GC threads, which pay off only in long-lived JVMs. With C1 only
# and the serial collector, two Spark test modules took 118 CPU-s instead of 175 on 2 cores. Semantics are
# the JVM's either way; a deployment keeps the JVM's defaults.
SHORT_LIVED_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def drop_iceberg_table(spark, warehouse: Path, namespace: str, table: str) -> None:
    """DROP TABLE, then its folder: DROP ... PURGE deletes the files one by one in a Spark job, tens of
    seconds for a small table on a loaded machine. Test tables live where the catalog puts them by
    default, `<warehouse>/<namespace>/<table>`."""
    spark.sql(f"DROP TABLE IF EXISTS lake.{namespace}.{table}")
    shutil.rmtree(warehouse / namespace / table, ignore_errors=True)
