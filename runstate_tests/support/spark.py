"""Spark and Iceberg helpers of the tests."""

from __future__ import annotations

import shutil
from pathlib import Path

# Every Spark driver the suite starts (each worker's session, CLI commands, the demo, the deployment's runs,
# all of which inherit this variable through spark-submit) lives seconds to minutes, and spends much of its
# CPU in the JIT's second tier and parallel GC threads, which pay off only in long-lived JVMs. With C1 only
# and the serial collector, two Spark test modules took 118 CPU-s instead of 175 on 2 cores. Semantics are
# the JVM's either way; a deployment keeps the JVM's defaults.
# With C1 only, the code cache is 48 MB, which a worker's session (it lives the whole suite) had filled 80 s
# into two test modules: the JVM then flushes compiled methods and compiles them again. At 240 MB (the
# tiered default), those two modules in one session compiled 33,000 methods instead of 59,000, and its JVM
# used 100.5 and 101.6 CPU-s instead of 109.7 and 112.6 (full tiered compilation: 156).
SHORT_LIVED_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=240m"


def drop_iceberg_table(spark, warehouse: Path, namespace: str, table: str) -> None:
    """DROP TABLE, then its folder: DROP ... PURGE deletes the files one by one in a Spark job, tens of
    seconds for a small table on a loaded machine. Test tables live where the catalog puts them by
    default, `<warehouse>/<namespace>/<table>`."""
    spark.sql(f"DROP TABLE IF EXISTS lake.{namespace}.{table}")
    shutil.rmtree(warehouse / namespace / table, ignore_errors=True)
