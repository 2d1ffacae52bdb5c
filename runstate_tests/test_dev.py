"""`runstate dev` answers GraphQL `{version}` on loopback and shuts down cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import dagster
import pytest

from runstate_tests.support.devserver import (
    RUNSTATE,
    free_port,
    graphql_version,
    launch_dev,
    wait_for_graphql,
)
from runstate_tests.support.procfs import command_line

SERVICE_VARS = (
    "RUNSTATE_PG_URL",
    "DAGSTER_PG_URL",
    "RUNSTATE_AWS_ENDPOINT_URL",
    "RUNSTATE_HOME",
    "DAGSTER_HOME",
)

pytestmark = pytest.mark.slow


def _descendants(pid: int) -> set[int]:
    found, frontier = set(), [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            children = (task / "children").read_text().split() if (task / "children").exists() else []
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    frontier.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _ignore_int_and_term() -> None:
    # How a shell's `runstate dev &` starts it: SIGINT ignored. We ignore SIGTERM too, the worst case.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@pytest.fixture
def dev_home():
    home = Path(tempfile.mkdtemp(prefix="runstate-dev-"))
    yield home
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_VARS} | {"RUNSTATE_HOME": str(home)}
    subprocess.run([RUNSTATE, "services", "down"], env=env, capture_output=True, timeout=120)
    shutil.rmtree(home, ignore_errors=True)


def test_dev_answers_graphql_on_loopback_and_stops_on_sigterm(fresh_database, dev_home):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_VARS and not k.startswith("SNOWFLAKE_")}
    env.update(
        RUNSTATE_HOME=str(dev_home),
        RUNSTATE_PG_URL=fresh_database,
        DAGSTER_PG_URL=fresh_database.replace("postgresql://", "postgresql+psycopg2://", 1),
    )
    log = dev_home / "dev.log"
    dev = launch_dev(port, env, log, preexec_fn=_ignore_int_and_term)
    try:
        version = wait_for_graphql(port, dev)
        assert version == dagster.__version__, log.read_text()[-3000:]
        services = json.loads((dev_home / ".runstate" / "services.json").read_text())
        service_pids = {r["pid"] for r in services.values() if r["pid"]}  # they outlive dev, by design
        dagster_processes = {pid: command_line(pid) for pid in _descendants(dev.pid) - service_pids}
        assert any("dagster" in cmd and " dev " in cmd for cmd in dagster_processes.values()), (
            dagster_processes
        )

        dev.send_signal(signal.SIGTERM)
        code = dev.wait(timeout=120)

        assert code == 0, log.read_text()[-3000:]
        assert graphql_version(port) is None
        assert {pid: cmd for pid, cmd in dagster_processes.items() if _alive(pid)} == {}
        assert all(_alive(pid) for pid in service_pids)
        assert "Dagster services shut down" in log.read_text()
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()


def test_dev_refuses_a_taken_port_with_what_to_do(dev_home):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k not in SERVICE_VARS} | {
            "RUNSTATE_HOME": str(dev_home)
        }

        dev = subprocess.run(
            [RUNSTATE, "dev", "--no-services", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert dev.returncode == 1
    assert f"dagster dev: port {port} on 127.0.0.1 is taken" in dev.stderr and "--port" in dev.stderr
