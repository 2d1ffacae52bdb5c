"""A class data sharing (CDS) archive for the suite's Spark drivers: made once per checkout and Java.

Every Spark driver of the suite (each worker's session, the CLI commands, the demo, the deployments' runs)
loads the same ten thousand classes of Spark, Scala and Iceberg from the same jars, and most live seconds:
loading and verifying those classes is half of each start. The JVM can map them from an archive instead
(JDK 13+ "dynamic archive": one driver run with `-XX:ArchiveClassesAtExit`, then every JVM with
`-XX:SharedArchiveFile`). Measured on 2 cores, one short Iceberg job in a new driver: 9.7 CPU-s without
the archive, 5.5 with it (wall 8.4 s, 4.6 s).

What makes it safe to share:
- The JVM checks the archive against its own build and class path (jar sizes and times) and, when they
  differ, runs without it: a stale archive costs speed, never behaviour. Its one line saying so is
  silenced (`-Xlog:cds*=off`), since it went to the stdout of commands whose output the tests read.
- A truncated archive crashes the JVM that maps it (SIGBUS, seen with Java 17): the archive is written
  under a temporary name and renamed into place only once the JVM that wrote it has exited. A JVM that
  starts before then finds no file and runs without one, so the suite does not wait for the build.
- The file's name carries a digest of the java binary and the Spark jars directory, so a checkout or a
  venv of its own makes its own, and concurrent suites at worst both write one (the last rename wins).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUILD_TIMEOUT_S = 300
CHECKOUT = Path(__file__).resolve().parents[2]
SILENT = "-Xlog:cds*=off"


def java_binary() -> Path | None:
    """The java that spark-submit runs: JAVA_HOME's, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def spark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def archive_path(java: Path) -> Path:
    """Where this checkout's archive for this java lives (in the temp dir: a cache, rebuilt when gone)."""
    jars = spark_jars_dir()
    stat = java.stat()
    key = (
        f"{java}:{stat.st_size}:{stat.st_mtime_ns}:{jars.resolve()}:{sorted(p.name for p in jars.iterdir())}"
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"runstate-spark-cds-{digest}.jsa"


def sharing_options(archive: Path) -> str:
    """Java options that map `archive` when it is there and fits this JVM, and say nothing otherwise."""
    return f"-XX:SharedArchiveFile={archive} {SILENT}"


def start_archive(base_options: str) -> Path | None:
    """The archive's path, to pass to every JVM at once; when it is missing, a detached process builds it.

    A JVM that starts before the archive is in place finds no file and runs without it (silently), so the
    suite does not wait for the build (about 40 s on 2 cores): the drivers started after it use it."""
    java = java_binary()
    if java is None:
        return None
    archive = archive_path(java)
    if archive.exists():
        return archive
    with archive.with_suffix(".log").open("w") as log:  # the builder keeps its own copy of the descriptor
        subprocess.Popen(
            [sys.executable, "-m", "runstate_tests.support.jvm_archive", str(archive), base_options],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,  # it outlives a short test session, and the session's Ctrl-C
            cwd=CHECKOUT,  # where `-m runstate_tests...` is found
        )
    return archive


def build_archive(archive: Path, base_options: str) -> None:
    """A training driver with `-XX:ArchiveClassesAtExit`, then its archive renamed into place once its
    JVM, which writes the archive as it exits after the Python process (it prints the JVM's pid), is gone."""
    partial = archive.with_name(f"{archive.stem}.{os.getpid()}.partial")
    env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{base_options} -XX:ArchiveClassesAtExit={partial} {SILENT}"}
    trainer = subprocess.Popen(
        [sys.executable, "-m", "runstate_tests.support.jvm_archive", "--train"],
        env=env,
        stdout=subprocess.PIPE,
    )
    try:
        out, _ = trainer.communicate(timeout=BUILD_TIMEOUT_S)
        jvm = int(out.split()[-1]) if trainer.returncode == 0 and out.split() else None
        if jvm is not None:
            _wait_for_exit(jvm, timeout=BUILD_TIMEOUT_S)
        if jvm is not None and partial.exists() and partial.stat().st_size > 0:
            os.replace(partial, archive)
            archive.with_suffix(".log").unlink(missing_ok=True)  # its stderr: empty, or a failed try's
        else:
            print(f"no archive: the training driver exited with {trainer.returncode}", file=sys.stderr)
    finally:
        trainer.kill()
        partial.unlink(missing_ok=True)


def _wait_for_exit(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    raise subprocess.TimeoutExpired(f"JVM {pid}", timeout)


def _train() -> None:
    """One driver doing what the suite's drivers do: the JDBC catalog, DDL, writes, MERGE, reads through
    Arrow, and the maintenance procedures, so their classes are in the archive."""
    import pandas as pd

    from runstate.spark import SparkSettings, build_session
    from runstate_tests.support.databases import create_database, drop_database, unique

    database = unique("rs_cds")
    warehouse = Path(tempfile.mkdtemp(prefix="runstate-cds-warehouse-"))
    try:
        spark = build_session(SparkSettings(pg_url=create_database(database), warehouse_dir=warehouse))
        spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.cds")
        spark.sql(
            "CREATE TABLE lake.cds.t (k bigint, v string, at timestamp) USING iceberg PARTITIONED BY (days(at))"
        )
        frame = pd.DataFrame({"k": [1, 2, 3], "v": ["a", "b", "c"], "at": pd.to_datetime(["2026-01-01"] * 3)})
        spark.createDataFrame(frame).writeTo("lake.cds.t").append()
        spark.createDataFrame(frame).createOrReplaceTempView("changes")
        spark.sql(
            "MERGE INTO lake.cds.t t USING changes c ON t.k = c.k WHEN MATCHED THEN UPDATE SET * "
            "WHEN NOT MATCHED THEN INSERT *"
        )
        spark.table("lake.cds.t").groupBy("v").count().toPandas()
        for call in (
            "rewrite_data_files(table => 'cds.t')",
            "rewrite_manifests(table => 'cds.t')",
            "expire_snapshots(table => 'cds.t', retain_last => 1)",
            "remove_orphan_files(table => 'cds.t')",
        ):
            spark.sql(f"CALL lake.system.{call}").collect()
        spark.sql("SELECT * FROM lake.cds.t.snapshots").collect()
        jvm = spark.sparkContext._gateway.proc.pid  # in a session of its own (runstate.spark)
        spark.stop()
        print(jvm)
    finally:
        drop_database(database)
        shutil.rmtree(warehouse, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--train"]:
        _train()
    else:
        build_archive(Path(sys.argv[1]), sys.argv[2])
