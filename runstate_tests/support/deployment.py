"""A `runstate dev` of the tests' own: its environment, its state as the UI's API and AWS show it, and
stopping it as a user would."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from runstate.procfs import alive, descendants
from runstate.wal import DatasetReader, WalTable, wal_status
from runstate_tests.deployment.gate import GatedMotoServer
from runstate_tests.support.devserver import RUNSTATE, free_port, graphql, launch_dev, poll, wait_for_graphql
from runstate_tests.support.moto import MotoProcess, moto_client

REPO_ROOT = Path(__file__).resolve().parents[2]
STRIPPED = ("RUNSTATE_", "DAGSTER_", "SNOWFLAKE_")
# Generous: two cores shared with other suites; a run worker alone takes 10-40 s to start there.
STARTUP_S = 300
# Issues 19 and 39: after a restart, a dead run stops holding its shard this soon. The flush run for a row
# appended after the restart is launched within it, and applies the row within it of its worker's start.
# The worker's own start between the two (a fresh Python process loading the code location) is reported,
# not bounded: 2-5 s on a quiet machine, but once 50 s in CI, on 2 cores beside three test workers and two
# Spark JVMs starting.
RESTART_BOUND_S = 60
# An export of the run history is a Spark run (a JVM of 10 to 25 CPU-s), and each minute in which a flush
# or merge run ran makes one due; a merge of the dataset tables (a Spark run too) follows each minute in
# which a dataset changed. A deployment whose tests are about neither does them hourly: the always-on
# deployment's processes took 166 CPU-s of a suite run with the defaults, 69 without these runs.
HOURLY_EXPORTS = {"RUNSTATE_HISTORY_EXPORT_INTERVAL_S": "3600"}
HOURLY_MERGES = {"RUNSTATE_DATASET_MERGE_INTERVAL_S": "3600"}


@dataclass
class Deployment:
    port: int
    env: dict[str, str]
    home: Path
    pg_url: str
    moto: GatedMotoServer | MotoProcess  # what the tests use of either: its url
    log: Path

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """`runstate ...` as a user types it, against this deployment."""
        result = subprocess.run(
            [RUNSTATE, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert result.returncode == 0, f"runstate {' '.join(args)}: {result.stderr[-3000:]}"
        return result

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        return graphql(self.port, query, variables)

    def aws(self, service: str) -> Any:
        return moto_client(self.moto.url, service)

    def event_store(self) -> Any:
        from runstate.eventstore import PostgresEventStore

        return PostgresEventStore(self.pg_url, schema="runstate")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def deployment_dagster_yaml(home: Path) -> Path:
    """The checkout's dagster.yaml, with run monitoring polling every few seconds for the tests."""
    config = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    config["run_monitoring"]["poll_interval_seconds"] = 5
    dagster_home = home / "dagster"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return dagster_home


def deployment_env(
    home: Path, pg_url: str, dagster_url: str, moto_url: str, dagster_home: Path | None = None, **extra: str
) -> dict[str, str]:
    """The environment of a deployment of the tests' own: this process's, without any endpoint of it;
    its Dagster home is `dagster_home`, else the checkout's dagster.yaml under `home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(STRIPPED)}
    env.update(
        RUNSTATE_HOME=str(home),
        DAGSTER_HOME=str(dagster_home or deployment_dagster_yaml(home)),
        RUNSTATE_PG_URL=pg_url,
        DAGSTER_PG_URL=dagster_url.replace("postgresql://", "postgresql+psycopg2://", 1),
        RUNSTATE_AWS_ENDPOINT_URL=moto_url,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        DAGSTER_TELEMETRY_ENABLED="false",
        **extra,
    )
    return env


RUNS = """query($filter: RunsFilter) { runsOrError(filter: $filter) { ... on Runs { results {
  runId status pipelineName } } } }"""


def dataset_state(deployment: Deployment, dataset: str) -> tuple[int, dict]:
    s3 = deployment.aws("s3")
    reader = DatasetReader(s3, "runstate-blobs", "datasets/", dataset)
    return reader.version, reader.state()


def pending_rows(deployment: Deployment, dataset: str) -> int:
    rows = [
        row
        for row in wal_status(WalTable(deployment.aws("dynamodb"), "runstate_wal"))
        if row.dataset_id == dataset
    ]
    return rows[0].pending_count if rows else -1


def visible(deployment: Deployment, dataset: str, version: int) -> tuple[int, dict] | None:
    """The dataset's (version, state) once a reader sees `version` and no row is left Pending."""
    seen = dataset_state(deployment, dataset)
    return seen if seen[0] >= version and pending_rows(deployment, dataset) == 0 else None


def location_loaded(deployment: Deployment) -> bool:
    query = "{ workspaceOrError { ... on Workspace { locationEntries { loadStatus locationOrLoadError {"
    query += " __typename }"
    query += " } } } }"
    entries = deployment.graphql(query)["workspaceOrError"]["locationEntries"]
    return any(
        (entry["locationOrLoadError"] or {}).get("__typename") == "RepositoryLocation" for entry in entries
    )


def stop_dev(dev: subprocess.Popen) -> None:
    """SIGTERM as a user's Ctrl-C would be, then whatever is left of its process group."""
    if dev.poll() is None:
        dev.send_signal(signal.SIGTERM)
        try:
            dev.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(dev.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    dev.wait()


def check_flush_after_restart(
    what: str, appended: float, created: float, started: float | None, visible_after: float
) -> None:
    """RESTART_BOUND_S on the flush run that applied a row appended after a restart (epoch seconds: the
    append, the run's creation and start; seconds from the append to the row visible); prints the figures."""
    launched_after = created - appended
    started_after = (started if started is not None else appended + visible_after) - appended
    figures = (
        f"{what}: flush run launched {launched_after:.1f} s, started {started_after:.1f} s, "
        f"row visible {visible_after:.1f} s after the append"
    )
    print(figures)
    assert launched_after <= RESTART_BOUND_S, figures
    assert visible_after - started_after <= RESTART_BOUND_S, figures


class Server:
    """One `runstate dev` that the test can stop by signal and start again on the same databases."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        for _ in range(3):  # a port another process took before our webserver bound it: another port
            self.deployment.port = free_port()
            self.process = launch_dev(
                self.deployment.port, self.deployment.env, self.deployment.log, start_new_session=True
            )
            if wait_for_graphql(self.deployment.port, self.process, timeout=STARTUP_S):
                break
            self.stop(signal.SIGKILL)
        assert self.process is not None, self.deployment.log_tail()
        poll(
            lambda: location_loaded(self.deployment), timeout=STARTUP_S, every=1, what="code location loaded"
        )

    def stop(self, sig: int, *, everyone: bool = True) -> None:
        """`sig` to every process of the deployment at once, as a reboot or a deploy's cgroup kill does:
        `runstate dev`, the `dagster dev` in its own session, the webserver, daemon, code server and run
        workers; or (`everyone=False`) to `runstate dev` alone, as a user's Ctrl-C or a service manager
        does. Then wait until none is left."""
        assert self.process is not None
        services = service_pids(self.deployment.home)  # they outlive `runstate dev` by design
        tree = [pid for pid in [self.process.pid, *descendants(self.process.pid)] if pid not in services]
        for pid in tree if everyone else tree[:1]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 180
        while any(alive(pid) for pid in tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in tree:  # whatever outlived a SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=60)
        self.process = None


def service_pids(home: Path) -> set[int]:
    """The embedded services `runstate dev` started (`.runstate/services.json`)."""
    path = home / ".runstate" / "services.json"
    records = json.loads(path.read_text()) if path.exists() else {}
    return {record["pid"] for record in records.values() if record.get("pid")}
