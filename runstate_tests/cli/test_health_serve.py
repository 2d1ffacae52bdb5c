"""`runstate health serve`: GET /tables/{database}/{table}/health over a real socket."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from runstate.maintenance.health import HealthAnalyzer
from runstate.maintenance.http import make_server
from runstate.maintenance.store import MaintenanceStore


def get(base: str, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(base + path, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def migrate(dsn: str, schema: str) -> None:
    """What `runstate db upgrade` does: the CLI checks the schema and never migrates it."""
    with MaintenanceStore(dsn, schema=schema) as store:
        store.ensure_schema()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def served_cli(pg_database: str, pg_schema: str):
    """The real command in its own process; only the Spark-free answers are asked of it."""
    migrate(pg_database, pg_schema)
    port = free_port()
    env = {**os.environ, "RUNSTATE_PG_URL": pg_database, "RUNSTATE_SCHEMA": pg_schema}
    runstate = os.path.join(os.path.dirname(sys.executable), "runstate")
    proc = subprocess.Popen(
        [runstate, "health", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "health serve did not start listening"
            time.sleep(0.2)
    yield base
    proc.terminate()
    proc.wait(timeout=30)


def test_serve_refuses_bad_identifiers_with_400_and_answers_cached_reads(served_cli, pg_database, pg_schema):
    with MaintenanceStore(pg_database, schema=pg_schema) as store:
        store.history.insert_health_snapshot(
            {
                "database": "db",
                "table": "orders",
                "needs_maintenance": False,
                "total_data_files": 3,
                "health_status": "Healthy",
            }
        )

    bad = get(served_cli, "/tables/db/orders%3BDROP/health")
    nul = get(served_cli, "/tables/db/%00/health")
    cached = get(served_cli, "/tables/db/orders/health?cached=true")
    unknown = get(served_cli, "/tables/db/nothing/health?cached=true")
    elsewhere = get(served_cli, "/nowhere")

    assert bad[0] == 400 and "not a valid identifier" in bad[1]["error"]
    assert nul[0] == 400
    assert cached[0] == 200 and (cached[1]["table"], cached[1]["total_data_files"]) == ("orders", 3)
    assert unknown[0] == 404 and elsewhere[0] == 404


@pytest.mark.spark
def test_serve_analyzes_live_with_the_same_json_as_the_cli_and_404s_unknown_tables(spark, iceberg_namespace):
    from runstate_tests.support.maintenance import make_table

    ref = make_table(spark, iceberg_namespace, files=6, rows=60)
    analyzer = HealthAnalyzer(spark)
    server = make_server("127.0.0.1", 0, analyzer.analyze, lambda ref: None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        live = get(base, f"/tables/{ref.database}/{ref.table}/health")
        missing = get(base, f"/tables/{ref.database}/absent/health")
    finally:
        server.shutdown()
        server.server_close()

    assert live[0] == 200
    assert (live[1]["total_data_files"], live[1]["recommended_actions"]) == (6, ["rewrite_data_files"])
    assert set(live[1]) >= {"database", "table", "health_status", "snapshot_count", "checked_at"}
    assert missing[0] == 404 and "not found" in missing[1]["error"]


def test_serve_on_a_port_in_use_prints_one_error_line_and_exits_1(pg_database, pg_schema):
    migrate(pg_database, pg_schema)
    env = {**os.environ, "RUNSTATE_PG_URL": pg_database, "RUNSTATE_SCHEMA": pg_schema}
    runstate = os.path.join(os.path.dirname(sys.executable), "runstate")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [runstate, "health", "serve", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]
