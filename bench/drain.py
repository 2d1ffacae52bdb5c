"""`bench/maintenance.py --drain N`: N queued jobs on small tables drained through `runstate dev`.

Starts `runstate dev` with its own RUNSTATE_HOME, a fresh database for runstate and Dagster storage,
and its own Iceberg warehouse; creates N five-file tables through a Spark session on the same JDBC
catalog, submits one rewrite_data_files job each, and waits until all are finished. Then drains
another N jobs in-process (one worker, one session) as the baseline measured in the same run.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from common import create_database, drop_database

from runstate.maintenance.models import CachedTable
from runstate.maintenance.runner import QueueWorker
from runstate.maintenance.store import MaintenanceStore

RUNSTATE = str(Path(sys.executable).parent / "runstate")
SCHEMA = "runstate"
FILES_PER_TABLE = 5
DEADLINE_S = 3600


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tables(spark, prefix: str, count: int) -> list[CachedTable]:
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.drain")
    for i in range(count):
        name = f"lake.drain.{prefix}{i}"
        spark.sql(f"CREATE TABLE {name} (id BIGINT, v STRING) USING iceberg")
        frame = spark.range(FILES_PER_TABLE * 10).selectExpr("id", "concat('v', id) AS v")
        frame.repartition(FILES_PER_TABLE).writeTo(name).append()
    return [CachedTable("drain", f"{prefix}{i}", True, {}) for i in range(count)]


def _wait_until_done(store: MaintenanceStore, jobs: list[str], dev: subprocess.Popen) -> float:
    began = time.perf_counter()
    while True:
        statuses = [store.queue.get_job(job_id).status for job_id in jobs]
        if all(status in ("completed", "failed", "cancelled") for status in statuses):
            assert statuses.count("completed") == len(jobs), statuses
            return time.perf_counter() - began
        assert dev.poll() is None, "runstate dev exited during the drain"
        assert time.perf_counter() - began < DEADLINE_S, f"{statuses.count('pending')} jobs still pending"
        time.sleep(1.0)


def _worker_runs(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM runs WHERE pipeline_name = 'iceberg_maintenance'").fetchone()
    return int(row[0])


def _start_dev(env: dict[str, str], home: Path) -> tuple[subprocess.Popen, object]:
    log = open(home / "dev.log", "wb")
    dev = subprocess.Popen(
        [RUNSTATE, "dev", "--port", str(_free_port())],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return dev, log


def _stop_dev(dev: subprocess.Popen, log, env: dict[str, str]) -> None:
    os.killpg(dev.pid, signal.SIGINT)
    try:
        dev.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(dev.pid, signal.SIGKILL)
    log.close()
    subprocess.run([RUNSTATE, "services", "down"], env=env, capture_output=True, timeout=120)


def drain_through_dev(admin_url: str, jobs: int, workers: int) -> dict:
    from runstate.spark import SparkSettings, build_session

    name, dsn = create_database(admin_url)
    home = Path(tempfile.mkdtemp(prefix="rs_bench_dev_"))
    warehouse = home / "warehouse"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNSTATE_", "DAGSTER_", "SNOWFLAKE_"))}
    env.update(
        RUNSTATE_HOME=str(home),
        RUNSTATE_PG_URL=dsn,
        RUNSTATE_WAREHOUSE=str(warehouse),
        DAGSTER_PG_URL=dsn.replace("postgresql://", "postgresql+psycopg2://", 1),
        RUNSTATE_MAINTENANCE_WORKERS=str(workers),
    )
    spark = build_session(SparkSettings(pg_url=dsn, warehouse_dir=warehouse, app_name="runstate-bench-drain"))
    spark.sparkContext.setLogLevel("ERROR")
    store = MaintenanceStore(dsn, schema=SCHEMA)
    try:
        store.ensure_schema()
        served, baseline = _tables(spark, "d", jobs), _tables(spark, "b", jobs)
        store.cache.replace_table_cache(served + baseline)
        dev, log = _start_dev(env, home)
        try:
            submitted = [store.submit(t.database, t.table, ["rewrite_data_files"]) for t in served]
            drain_s = _wait_until_done(store, submitted, dev)
            runs = _worker_runs(dsn)
        finally:
            _stop_dev(dev, log, env)
        # The baseline: the same work drained in this process by one worker, with no Dagster around it.
        for table in baseline:
            store.submit(table.database, table.table, ["rewrite_data_files"])
        report = QueueWorker(store, "bench-inprocess", lease_seconds=300).drain(
            spark, budget_seconds=DEADLINE_S
        )
        assert [o.status for o in report.outcomes] == ["completed"] * jobs
        return {
            "bench": "maintenance_drain",
            "jobs": jobs,
            "workers": workers,
            "drain_s": round(drain_s, 1),
            "runs": runs,
            "runs_floor_met": runs <= workers + 1,
            "inprocess_drain_s": round(report.elapsed_seconds, 1),
        }
    finally:
        store.close()
        spark.stop()
        drop_database(admin_url, name)
        shutil.rmtree(home, ignore_errors=True)
