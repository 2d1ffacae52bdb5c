"""`runstate services up|status|down` through the real command, in a RUNSTATE_HOME of the test's own."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import boto3
import psycopg
import pytest
import snowflake.connector
from psycopg import sql
from services_helpers import RUNSTATE, clean_env

from runstate.config import read_env_file
from runstate.services.state import process_start_time


def _records(home: Path) -> dict:
    path = home / ".runstate" / "services.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _server_url(dsn: str, database: str, scheme: str = "postgresql://") -> str:
    return dsn.rpartition("/")[0].replace("postgresql://", scheme, 1) + f"/{database}"


@pytest.fixture
def dagster_database(fresh_database: str):
    """(name, URL) of a database that `up` has to create itself; dropped afterwards."""
    name = f"{fresh_database.rpartition('/')[2]}_dagster"
    yield name, _server_url(fresh_database, name, "postgresql+psycopg2://")
    with psycopg.connect(_server_url(fresh_database, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_up_status_down_round_trip(services_home, runstate_cli, fresh_database, dagster_database):
    dagster_name, dagster_url = dagster_database
    env = clean_env(services_home, RUNSTATE_PG_URL=fresh_database, DAGSTER_PG_URL=dagster_url)

    (services_home / ".env").write_text("MY_OWN_SETTING=kept\n")  # a user's .env: our block joins it
    up = runstate_cli("services", "up", env=env)
    assert up.returncode == 0, up.stderr

    written = read_env_file(services_home / ".env")
    assert written["MY_OWN_SETTING"] == "kept"
    assert written["RUNSTATE_PG_URL"] == fresh_database
    assert written["DAGSTER_PG_URL"] == dagster_url
    with psycopg.connect(_server_url(fresh_database, "postgres")) as conn:
        assert conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dagster_name,)).fetchone()
    with psycopg.connect(fresh_database) as conn:
        assert conn.execute("SELECT to_regclass('runstate.eventstore_migrations')").fetchone()[0] is not None
    dynamodb = boto3.client(
        "dynamodb",
        endpoint_url=written["RUNSTATE_AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    assert "runstate_wal" in dynamodb.list_tables()["TableNames"]
    s3 = boto3.client(
        "s3",
        endpoint_url=written["RUNSTATE_AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    assert "runstate-blobs" in [bucket["Name"] for bucket in s3.list_buckets()["Buckets"]]
    snow = snowflake.connector.connect(
        host=written["SNOWFLAKE_HOST"],
        port=int(written["SNOWFLAKE_PORT"]),
        protocol=written["SNOWFLAKE_PROTOCOL"],
        account=written["SNOWFLAKE_ACCOUNT"],
        user=written["SNOWFLAKE_USER"],
        password=written["SNOWFLAKE_PASSWORD"],
        database=written["SNOWFLAKE_DATABASE"],
    )
    assert snow.cursor().execute("SELECT 1").fetchone() == (1,)
    snow.close()

    status = runstate_cli("services", "status", env=env)
    assert status.returncode == 0, status.stdout
    assert [line.split()[:2] for line in status.stdout.splitlines()] == [
        ["postgres", "external"],
        ["moto", "embedded"],
        ["fakesnow", "embedded"],
    ]
    assert status.stdout.count(" healthy ") == 3

    pids = {name: record["pid"] for name, record in _records(services_home).items()}
    again = runstate_cli("services", "up", env=env)
    assert again.returncode == 0, again.stderr
    assert {name: record["pid"] for name, record in _records(services_home).items()} == pids  # reused

    down = runstate_cli("services", "down", env=env)
    assert down.returncode == 0, down.stderr
    assert "postgres  external: not ours, left running" in down.stdout
    assert process_start_time(pids["moto"]) is None
    assert process_start_time(pids["fakesnow"]) is None
    assert read_env_file(services_home / ".env") == {"MY_OWN_SETTING": "kept"}
    assert runstate_cli("services", "status", env=env).returncode == 1
    with psycopg.connect(fresh_database) as conn:  # the configured server is never stopped
        assert conn.execute("SELECT 1").fetchone() == (1,)


def _processes_started_for(home: Path) -> set[int]:
    """Every live process whose environment names this RUNSTATE_HOME (the services inherit it)."""
    marker = f"RUNSTATE_HOME={home}".encode()
    found = set()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes().split(b"\0") and process_start_time(int(environ.parent.name)):
                found.add(int(environ.parent.name))
        except OSError:
            continue  # gone, or not ours to read
    return found


def test_two_concurrent_ups_start_each_service_once(services_home, fresh_database):
    env = clean_env(
        services_home,
        RUNSTATE_PG_URL=fresh_database,
        DAGSTER_PG_URL=_server_url(
            fresh_database, fresh_database.rpartition("/")[2], "postgresql+psycopg2://"
        ),
    )

    racers = [
        subprocess.Popen(
            [RUNSTATE, "services", "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outcomes = [(racer.wait(timeout=180), racer.stderr.read()) for racer in racers]

    assert [code for code, _ in outcomes] == [0, 0], outcomes
    recorded = {record["pid"] for record in _records(services_home).values() if record["pid"]}
    assert len(recorded) == 2  # moto and fakesnow; Postgres is the configured one
    assert _processes_started_for(services_home) == recorded  # nothing orphaned by the loser


def test_status_flags_a_dead_service_and_up_restarts_it(services_home, runstate_cli, fresh_database):
    env = clean_env(
        services_home,
        RUNSTATE_PG_URL=fresh_database,
        DAGSTER_PG_URL=_server_url(
            fresh_database, fresh_database.rpartition("/")[2], "postgresql+psycopg2://"
        ),
    )
    assert runstate_cli("services", "up", env=env).returncode == 0
    moto_pid = _records(services_home)["moto"]["pid"]
    os.kill(moto_pid, signal.SIGKILL)

    status = runstate_cli("services", "status", env=env)

    assert status.returncode == 1
    moto_line = next(line for line in status.stdout.splitlines() if line.startswith("moto"))
    assert "UNHEALTHY" in moto_line and f"process {moto_pid} is gone" in moto_line
    assert runstate_cli("services", "up", env=env).returncode == 0
    assert _records(services_home)["moto"]["pid"] != moto_pid
    assert runstate_cli("services", "status", env=env).returncode == 0


def test_a_taken_port_is_refused_before_anything_starts(services_home, runstate_cli, fresh_database):
    with contextlib.closing(socket.socket()) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        env = clean_env(services_home, RUNSTATE_PG_URL=fresh_database)

        up = runstate_cli("services", "up", "--moto-port", str(port), env=env)

    assert up.returncode == 1
    assert f"moto: port {port} on 127.0.0.1 is taken" in up.stderr
    assert "--moto-port" in up.stderr
    assert _records(services_home) == {}
    assert not (services_home / ".env").exists()


def test_missing_postgres_binaries_say_what_to_do(services_home, runstate_cli, tmp_path):
    empty_bin = tmp_path / "no-postgres-here"
    empty_bin.mkdir()
    env = clean_env(services_home, RUNSTATE_PG_BIN=str(empty_bin))

    up = runstate_cli("services", "up", "--embedded-pg", env=env)

    assert up.returncode == 1
    assert f"`initdb` is missing from {empty_bin}" in up.stderr
    assert "apt-get install -y postgresql" in up.stderr and "RUNSTATE_PG_URL" in up.stderr
    assert _records(services_home) == {}


def test_an_unreachable_configured_postgres_is_named(services_home, runstate_cli):
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    env = clean_env(services_home, RUNSTATE_PG_URL=f"postgresql://postgres@127.0.0.1:{closed_port}/runstate")

    up = runstate_cli("services", "up", env=env)

    assert up.returncode == 1
    assert (
        f"RUNSTATE_PG_URL=postgresql://postgres@127.0.0.1:{closed_port}/runstate does not answer" in up.stderr
    )


@pytest.mark.slow  # initdb + server starts: several seconds
def test_embedded_cluster_is_initialised_reused_and_restarted_with_its_data(services_home, runstate_cli):
    env = clean_env(services_home)

    up = runstate_cli("services", "up", "--embedded-pg", env=env)

    assert up.returncode == 0, up.stderr
    record = _records(services_home)["postgres"]
    assert record["kind"] == "embedded" and record["port"] != 5432
    with psycopg.connect(record["url"], autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('runstate.eventstore_migrations')").fetchone()[0] is not None
        assert conn.execute("SELECT 1 FROM pg_database WHERE datname = 'dagster'").fetchone()
        conn.execute("CREATE TABLE public.kept (note TEXT)")
        conn.execute("INSERT INTO public.kept VALUES ('survives a restart')")

    assert runstate_cli("services", "up", env=env).returncode == 0  # the cluster is chosen again, not 5432
    assert _records(services_home)["postgres"]["pid"] == record["pid"]

    assert runstate_cli("services", "down", env=env).returncode == 0
    assert process_start_time(record["pid"]) is None
    assert runstate_cli("services", "up", env=env).returncode == 0
    restarted = _records(services_home)["postgres"]
    assert restarted["kind"] == "embedded" and restarted["pid"] != record["pid"]
    with psycopg.connect(restarted["url"]) as conn:
        assert conn.execute("SELECT note FROM public.kept").fetchall() == [("survives a restart",)]
