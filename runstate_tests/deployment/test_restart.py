"""`runstate dev` stopped mid-linger (SIGKILL, then SIGTERM, to every process of it) and started again.

Its flush runs were alive when it stopped. After each restart a row appended is visible within 60 s
(the dead runs are known dead from their stale heartbeat, not after `dagster/max_runtime`), and every
row is applied exactly once. One server pair of its own (home, databases, moto) serves both signals,
so the test can kill it without disturbing the shared deployment of the other tests.

Its moto runs in a process of its own. moto keeps its tables in module globals, so a second moto server
in this pytest process would share the WAL table and blob bucket of the shared deployment's: while that
deployment was up, its daemon flushed this test's rows, and this server listed no flush run at all.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runstate.wal import DatasetReader, WalProducer, WalTable, wal_status
from runstate.wal.changes import Change, fold
from runstate.wal.layout import APPLIED_PREFIX
from runstate_tests.conftest import MotoProcess, create_database, drop_database, unique
from runstate_tests.deployment.conftest import STRIPPED, Deployment, _location_loaded, deployment_dagster_yaml
from runstate_tests.devserver import RUNSTATE, descendants, free_port, launch_dev, poll, wait_for_graphql

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deployment"), pytest.mark.timeout(2400)]

STARTUP_S = 300
FIRST_FLUSH_S = 400  # the first run worker of a fresh server, on a loaded machine
VISIBLE_AFTER_RESTART_S = 60  # issue 19: the bound this test is about
DATASET = "restart"
RUNS = """query($filter: RunsFilter) { runsOrError(filter: $filter) { ... on Runs { results {
  runId status } } } }"""
RUN = """query($runId: ID!) { runOrError(runId: $runId) { ... on Run { status endTime } } }"""


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
            lambda: _location_loaded(self.deployment), timeout=STARTUP_S, every=1, what="code location loaded"
        )

    def stop(self, sig: int) -> None:
        """`sig` to every process of the deployment at once, as a reboot or a deploy's cgroup kill does:
        `runstate dev`, the `dagster dev` in its own session, the webserver, daemon, code server and run
        workers. Then wait until none is left."""
        assert self.process is not None
        tree = [self.process.pid, *descendants(self.process.pid)]
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 120
        while any(alive(pid) for pid in tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in tree:  # whatever outlived a SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=60)
        self.process = None


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture
def server() -> Iterator[Server]:
    home = Path(tempfile.mkdtemp(prefix="runstate-restart-"))
    databases = [unique("rs_restart"), unique("rs_restart_dagster")]
    pg_url, dagster_url = (create_database(name) for name in databases)
    moto = MotoProcess()
    env = {k: v for k, v in os.environ.items() if not k.startswith(STRIPPED)}
    env.update(
        RUNSTATE_HOME=str(home),
        DAGSTER_HOME=str(deployment_dagster_yaml(home)),
        RUNSTATE_PG_URL=pg_url,
        DAGSTER_PG_URL=dagster_url.replace("postgresql://", "postgresql+psycopg2://", 1),
        RUNSTATE_AWS_ENDPOINT_URL=moto.url,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        DAGSTER_TELEMETRY_ENABLED="false",
        # Long enough that the flush runs are still lingering when the server is stopped.
        RUNSTATE_WAL_FLUSH_LINGER_S="120",
    )
    server = Server(Deployment(0, env, home, pg_url, moto, home / "dev.log"))
    try:
        yield server
    finally:
        if server.process is not None:
            server.stop(signal.SIGKILL)
        subprocess.run([RUNSTATE, "services", "down"], env=env, capture_output=True, timeout=120)
        moto.stop()
        for name in databases:
            drop_database(name)
        shutil.rmtree(home, ignore_errors=True)


def lingering_runs(deployment: Deployment) -> list[str]:
    runs = deployment.graphql(RUNS, {"filter": {"statuses": ["STARTED"], "pipelineName": "flush_wal"}})
    return [run["runId"] for run in runs["runsOrError"]["results"]]


def flush_runs(deployment: Deployment) -> list[tuple[str, str]]:
    runs = deployment.graphql(RUNS, {"filter": {"pipelineName": "flush_wal"}})
    return [(run["runId"][:8], run["status"]) for run in runs["runsOrError"]["results"]]


@contextlib.contextmanager
def explained(server: Server) -> Iterator[None]:
    """A failed wait says what the deployment did: its flush runs, its liveness verdicts, its log's end."""
    try:
        yield
    except AssertionError as exc:
        log = server.deployment.log.read_text(errors="replace")
        verdicts = [line for line in log.splitlines() if "heartbeat" in line][-10:]
        raise AssertionError(
            f"{exc}\nflush runs: {flush_runs(server.deployment)}\nliveness: {verdicts}\n"
            f"log tail:\n{server.deployment.log_tail(3000)}"
        ) from None


def visible_at(deployment: Deployment, version: int) -> bool:
    reader = DatasetReader(deployment.aws("s3"), "runstate-blobs", "datasets/", DATASET)
    rows = [
        r for r in wal_status(WalTable(deployment.aws("dynamodb"), "runstate_wal")) if r.dataset_id == DATASET
    ]
    return reader.version >= version and bool(rows) and rows[0].pending_count == 0


def append(deployment: Deployment, key: str, value: int) -> int:
    return WalProducer(deployment.aws("dynamodb"), "runstate_wal").append(
        DATASET, [Change.upsert(key, value)]
    )


def applied_once(deployment: Deployment, changes: list[Change]) -> None:
    """Every seq Applied, in exactly one blob, and the reader's state is the fold of the changes."""
    reader = DatasetReader(deployment.aws("s3"), "runstate-blobs", "datasets/", DATASET)
    covered = [seq for ref in reader.manifest().blobs() for seq in range(ref.first_seq, ref.last_seq + 1)]
    statuses = [
        item["StatusIdx"]["S"]
        for item in deployment.aws("dynamodb").query(
            TableName="runstate_wal",
            KeyConditionExpression="DatasetId = :d AND SeqNo > :z",
            ExpressionAttributeValues={":d": {"S": DATASET}, ":z": {"N": "0"}},
        )["Items"]
    ]
    assert covered == list(range(1, len(changes) + 1))
    assert len(statuses) == len(changes) and all(s.startswith(APPLIED_PREFIX) for s in statuses)
    assert reader.read() == (len(changes), fold({}, changes))


def a_run_lingering(server: Server) -> None:
    """The stop must come mid-linger: a flush run of this server is STARTED (it flushed the last row)."""
    with explained(server):
        poll(
            lambda: bool(lingering_runs(server.deployment)),
            timeout=FIRST_FLUSH_S,
            every=1,
            what="a flush run lingering",
        )


def ends(deployment: Deployment, run_ids: list[str]) -> dict[str, tuple[str, float | None]]:
    """Each run's status and recorded end time (epoch seconds, None while it has none)."""
    found = {}
    for run_id in run_ids:
        run = deployment.graphql(RUN, {"runId": run_id})["runOrError"]
        found[run_id[:8]] = (run["status"], run["endTime"])
    return found


def restart_then_append(server: Server, sig: int, changes: list[Change]) -> float:
    """Stop mid-linger by `sig`, start again, append; returns the seconds from append to visible.

    After a SIGTERM, the runs that lingered must have recorded their own end before they exited: a run
    worker told to stop ends its run (Dagster's retry policy would otherwise re-run the interrupted step in
    the dying process, and the run stayed STARTED until the restarted deployment found it dead)."""
    a_run_lingering(server)
    lingering = lingering_runs(server.deployment)
    server.stop(sig)
    stopped = time.time()
    server.start()
    if sig == signal.SIGTERM:
        recorded = ends(server.deployment, lingering)
        assert all(end is not None and end <= stopped for _, end in recorded.values()), recorded
    change = Change.upsert(f"after-{signal.Signals(sig).name}", len(changes) + 1)
    changes.append(change)
    appended = time.monotonic()
    seq = append(server.deployment, change.key, change.value)
    with explained(server):
        poll(
            lambda: visible_at(server.deployment, seq),
            timeout=VISIBLE_AFTER_RESTART_S,
            every=0.5,
            what=f"row {seq} visible after a restart by {signal.Signals(sig).name}",
        )
    return time.monotonic() - appended


def test_a_restart_mid_linger_applies_new_rows_within_a_minute_and_every_row_once(server: Server):
    server.start()
    changes = [Change.upsert("before", 0)]
    seq = append(server.deployment, "before", 0)
    poll(lambda: visible_at(server.deployment, seq), timeout=FIRST_FLUSH_S, every=1, what="the first flush")

    after_kill = restart_then_append(server, signal.SIGKILL, changes)
    after_term = restart_then_append(server, signal.SIGTERM, changes)

    applied_once(server.deployment, changes)
    print(f"append-to-visible after restart: SIGKILL {after_kill:.1f} s, SIGTERM {after_term:.1f} s")
    assert "terminate called" not in server.deployment.log.read_text(errors="replace")
