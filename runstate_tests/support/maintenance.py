"""Maintenance tests' helpers: SQL past the store, Iceberg tables of a test's own, and a worker in a
process of its own (runstate_tests/maintenance/worker_process.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.models import CachedTable
from runstate.maintenance.store import MaintenanceStore
from runstate_tests.support.devserver import poll

WORKER_SCRIPT = Path(__file__).parents[1] / "maintenance" / "worker_process.py"


def sql(dsn: str, query: str, *params: object, schema: str | None = None) -> list[tuple]:
    options = f"-c search_path={schema}" if schema else ""
    with psycopg.connect(dsn, autocommit=True, options=options) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def store_sql(store: MaintenanceStore, query: str, *params: object) -> list[tuple]:
    """`sql` in the store's own database and schema, past the store (to set up or inspect a state)."""
    return sql(store.dsn, query, *params, schema=store.schema)


@contextmanager
def queue_store(dsn: str, schema: str) -> Iterator[MaintenanceStore]:
    """A migrated MaintenanceStore whose table cache holds db.t0 to db.t7: what the queue's tests submit."""
    with MaintenanceStore(dsn, schema=schema) as store:
        store.ensure_schema()
        store.cache.replace_table_cache([CachedTable("db", f"t{i}") for i in range(8)])
        yield store


def job_rows(store: MaintenanceStore, job_id: str) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """The job's rows in jobs, job_queue and job_actions: a fenced-out call must leave them as they were."""
    return (
        store_sql(store, "SELECT * FROM jobs WHERE job_id = %s", job_id),
        store_sql(store, "SELECT * FROM job_queue WHERE job_id = %s", job_id),
        store_sql(store, "SELECT * FROM job_actions WHERE job_id = %s ORDER BY id", job_id),
    )


def run_out_lease(store: MaintenanceStore, job_id: str) -> None:
    """The job's lease ends now: what the clock does once the lease's seconds pass, without waiting them.
    Only for a holder that cannot renew it (stopped, killed or gone), as a lease runs out in life."""
    store_sql(
        store, "UPDATE job_queue SET visible_at = now() - interval '1 second' WHERE job_id = %s", job_id
    )


def make_table(
    spark,
    namespace: str,
    name: str = "events",
    *,
    files: int = 6,
    rows: int = 600,
    deletes: bool = False,
    enabled: str | None = "true",
    properties: str = "",
) -> TableRef:
    """A format-2 merge-on-read table of `files` small data files; `deletes` adds position deletes in
    (almost) every file, `enabled` sets the maintenance opt-in, `properties` adds more table properties."""
    ref = TableRef(namespace, name)
    extra = f", 'runstate.maintenance.enabled'='{enabled}'" if enabled else ""
    extra += f", {properties}" if properties else ""
    spark.sql(
        f"CREATE TABLE lake.{ref.quoted} (id BIGINT, v STRING) USING iceberg TBLPROPERTIES "
        f"('format-version'='2', 'write.delete.mode'='merge-on-read'{extra})"
    )
    frame = spark.range(rows).selectExpr("id", "concat('v', id) AS v").repartition(files)
    frame.writeTo(f"lake.{ref.quoted}").append()
    if deletes:
        spark.sql(f"DELETE FROM lake.{ref.quoted} WHERE id % 7 = 0")
    return ref


def cache(store: MaintenanceStore, *refs: TableRef) -> None:
    store.cache.replace_table_cache([CachedTable(ref.database, ref.table, True, {}) for ref in refs])


def rows(spark, ref: TableRef) -> list[tuple]:
    return [tuple(r) for r in spark.sql(f"SELECT id, v FROM lake.{ref.quoted} ORDER BY id").collect()]


def snapshot_operations(spark, ref: TableRef) -> list[str]:
    frame = spark.table(f"lake.{ref.quoted}.snapshots").orderBy("committed_at")
    return [r["operation"] for r in frame.select("operation").collect()]


def wait_for(
    condition: Callable[[], object], what: str, timeout: float = 240.0, every: float = 0.25
) -> object:
    """Poll with a generous deadline: this machine is shared and slow, never time-sensitive."""
    return poll(condition, timeout=timeout, every=every, what=f"waiting for {what}")


class WorkerProcess:
    """worker_process.py in a process group of its own, so a signal reaches its JVM too.

    One JVM serves job after job (as a worker run does); `claim` hands it the next one. `spark` overrides
    its SparkSettings (a `spark://` master, extra_conf).
    """

    def __init__(self, dsn: str, warehouse: Path, spark: dict | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT), dsn, str(warehouse), json.dumps(spark or {})],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.running_a_job = False

    def claim(self, schema: str, lease_seconds: float) -> dict:
        """Make the worker claim a job of `schema`; returns {"job_id", "attempt_id", "worker"} once it has."""
        self.proc.stdin.write(json.dumps({"schema": schema, "lease_seconds": lease_seconds}) + "\n")
        self.proc.stdin.flush()
        self.running_a_job = True
        return self._read_json()

    def outcome(self) -> dict:
        """The outcome of the job it claimed last, once it is done with it."""
        outcome = self._read_json()
        self.running_a_job = False
        return outcome

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read_json(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, f"worker exited early with {self.proc.wait()}"
        return json.loads(line)

    def signal(self, sig: signal.Signals) -> None:
        os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
        self.proc.wait(timeout=60)


def table_location(spark, ref: TableRef) -> Path:
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED lake.{ref.quoted}").collect()
    location = next(r.data_type for r in rows if r.col_name == "Location")
    return Path(location.replace("file://", "", 1).replace("file:", "", 1))
