"""What a deployment test samples while the deployment works: runs per shard, and live Spark JVMs.

A thread reads, every `every_s`, the runs in progress per job and shard tag value from the Dagster run storage
(Postgres), and counts the Spark drivers (SparkSubmit JVMs) among the deployment's processes. It keeps
the peaks, and the sample that reached each one, for the assertion messages and the report.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from runstate_tests.support.devserver import descendants

SHARD_TAGS = ("runstate/wal_shard", "runstate/merge_shard")
IN_PROGRESS = ("NOT_STARTED", "STARTING", "STARTED", "CANCELING")
RUNS_PER_SHARD = """
SELECT t.key, t.value, count(*), array_agg(r.run_id || ' ' || r.pipeline_name || ' ' || r.status)
FROM runs r JOIN run_tags t ON t.run_id = r.run_id
WHERE r.status = ANY(%s) AND t.key = ANY(%s)
GROUP BY t.key, t.value, r.pipeline_name
"""
# Per job: a shard is never flushed, or merged, by two runs at once. The daily compact_wal (03:10 UTC) carries
# the shard's tag too and may run beside its flush, as it does beside an always-on flusher: both switch a
# manifest only by conditional puts (runstate/defs/wal/always_on.py). Counted with the flushes, a suite that
# crossed 03:10 saw "two runs on shard 0" in a plain instance, which has no tag limits to queue it.


def spark_jvms(root: int) -> set[int]:
    """The Spark drivers under `root`, one JVM per run with a Spark session: PySpark's gateway, `java ...
    org.apache.spark.deploy.SparkSubmit ... pyspark-shell`.

    Not counted, though they name SparkSubmit too:
    - the `spark-class` shell script that starts the driver, and the launcher JVM that the script runs
      first to build the command line (`org.apache.spark.launcher.Main`). Counting them, one starting
      session counted three;
    - a child of a driver. When the JVM starts a process (posix_spawn of jspawnhelper, for a shell command
      of Hadoop's local file system), the child shows the JVM's command line until its exec. A loaded
      machine keeps it there long enough for a sample to see it: one driver sampled as two."""
    drivers: dict[int, int] = {}  # pid -> parent pid
    for pid in descendants(root):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if (
            argv
            and Path(argv[0].decode(errors="replace")).name == "java"
            and b"org.apache.spark.deploy.SparkSubmit" in argv
            and b"org.apache.spark.launcher.Main" not in argv
        ):
            drivers[pid] = parent
    return {pid for pid, parent in drivers.items() if parent not in drivers}


@dataclass
class Peaks:
    runs_per_shard: int = 0
    runs_per_shard_sample: list = field(default_factory=list)
    spark_jvms: int = 0
    samples: int = 0


class Sampler:
    """Samples until stopped; `root_pid()` names the deployment's top process (it changes on a restart)."""

    def __init__(self, dagster_db_url: str, root_pid: Callable[[], int | None], every_s: float = 0.5):
        self._url, self._root_pid, self._every = dagster_db_url, root_pid, every_s
        self.peaks = Peaks()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="deployment-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        with psycopg.connect(self._url, autocommit=True) as conn:
            while not self._stop.wait(self._every):
                try:
                    self._sample(conn)
                except psycopg.errors.UndefinedTable:  # Dagster has not made its tables yet
                    continue

    def _sample(self, conn: psycopg.Connection) -> None:
        rows = conn.execute(RUNS_PER_SHARD, (list(IN_PROGRESS), list(SHARD_TAGS))).fetchall()
        for key, value, count, runs in rows:
            if count > self.peaks.runs_per_shard:
                self.peaks.runs_per_shard = count
                self.peaks.runs_per_shard_sample = [key, value, runs]
        root = self._root_pid()
        if root is not None:
            self.peaks.spark_jvms = max(self.peaks.spark_jvms, len(spark_jvms(root)))
        self.peaks.samples += 1
