"""Plain Dagster commands work in a project folder after `services up`, without the `runstate` wrapper.

The project folder is a copy of the checkout's dagster.yaml and workspace.yaml with the `.env` block
that `services up` writes (the same function, pointed at this test's database and moto). The commands
get an environment with none of the endpoints in it: whatever they find, they found in `.env`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from runstate.services.env_file import write_env_file
from runstate_tests.devserver import free_port, graphql, poll, wait_for_graphql

REPO_ROOT = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).parent / "dagster")
ENDPOINT_VARS = ("RUNSTATE_", "DAGSTER_PG_URL", "DAGSTER_HOME", "SNOWFLAKE_")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # each wait has its own deadline


@pytest.fixture
def project(tmp_path: Path, fresh_database: str, moto_endpoint: str, monkeypatch) -> Iterator[Path]:
    for name in ("dagster.yaml", "workspace.yaml"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    monkeypatch.setenv("RUNSTATE_HOME", str(tmp_path))  # where write_env_file puts `.env`
    write_env_file(
        {
            "RUNSTATE_PG_URL": fresh_database,
            "DAGSTER_PG_URL": fresh_database.replace("postgresql://", "postgresql+psycopg2://", 1),
            "RUNSTATE_AWS_ENDPOINT_URL": moto_endpoint,
        }
    )
    yield tmp_path


def bare_env(project: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without one endpoint in it; RUNSTATE_HOME names the project, as a checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENDPOINT_VARS)}
    return {**env, "RUNSTATE_HOME": str(project), "DAGSTER_TELEMETRY_ENABLED": "false", **extra}


def validate(project: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [DAGSTER, "definitions", "validate", "-w", "workspace.yaml"],
        cwd=project,
        env=bare_env(project, DAGSTER_HOME=str(project)),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_dagster_definitions_validate_finds_the_instance_settings_in_dot_env(project):
    passed = validate(project)
    (project / ".env").unlink()
    without = validate(project)

    assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-3000:]
    assert "All code locations passed validation" in passed.stdout + passed.stderr
    assert without.returncode != 0 and "DAGSTER_PG_URL" in without.stdout + without.stderr


def test_plain_dagster_dev_serves_the_deployment_on_the_dot_env_instance(project, fresh_database):
    port = free_port()
    log = project / "dagster-dev.log"
    with open(log, "wb") as out:
        # No DAGSTER_HOME: dagster dev makes a temporary home but reads dagster.yaml from its folder.
        dev = subprocess.Popen(
            [DAGSTER, "dev", "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"],
            cwd=project,
            env=bare_env(project),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        assert wait_for_graphql(port, dev, timeout=300), log.read_text()[-3000:]
        location = poll(lambda: _loaded_location(port), timeout=300, what="code location loaded")
        queue = graphql(
            port, "{ instance { runQueueConfig { maxConcurrentRuns tagConcurrencyLimitsYaml } } }"
        )

        assert location == "runstate"
        config = queue["instance"]["runQueueConfig"]
        assert config["maxConcurrentRuns"] == 8 and "runstate/wal_shard" in config["tagConcurrencyLimitsYaml"]
        with psycopg.connect(fresh_database) as conn:  # the run storage is the database named in .env
            assert conn.execute("SELECT to_regclass('runs')").fetchone()[0] is not None
    finally:
        _stop(dev)


def _loaded_location(port: int) -> str | None:
    query = """{ workspaceOrError { ... on Workspace { locationEntries {
        name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
    entries = graphql(port, query)["workspaceOrError"]["locationEntries"]
    for entry in entries:
        loaded = entry["locationOrLoadError"] or {}
        if loaded.get("__typename") == "PythonError":
            raise AssertionError(f"code location {entry['name']} failed to load: {loaded['message']}")
        if entry["loadStatus"] == "LOADED" and loaded.get("__typename") == "RepositoryLocation":
            return entry["name"]
    return None


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # whatever of its group is left (code server, daemon)
    except ProcessLookupError:
        pass
    process.wait()
