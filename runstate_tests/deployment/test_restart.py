"""`runstate dev` with a lingering flush worker paused past the dead bound, then stopped mid-linger (SIGKILL
to every process of it, then SIGTERM to `runstate dev` alone, as a user's Ctrl-C) and started again.

The paused worker's run is failed and stays failed when the worker resumes (the worker stops itself),
and its row is applied by the run that replaced it. Its flush runs were alive when it stopped. After
each restart a flush run for a row appended is launched within 60 s (the dead runs are known dead from
their stale heartbeat, not after `dagster/max_runtime`), it applies the row within 60 s of its start, and
every row is applied exactly once. One server pair of
its own (home, databases, moto) serves every phase, so the test can kill it without disturbing the
shared deployment of the other tests.

Its moto runs in a process of its own. moto keeps its tables in module globals, so a second moto server
in this pytest process would share the WAL table and blob bucket of the shared deployment's: while that
deployment was up, its daemon flushed this test's rows, and this server listed no flush run at all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dagster._core.events.log import EventLogEntry
from dagster._serdes import deserialize_value

from runstate.procfs import alive
from runstate.wal import DatasetReader, WalProducer, WalTable, wal_status
from runstate.wal.changes import Change, fold
from runstate.wal.layout import APPLIED_PREFIX
from runstate_tests.deployment.sampling import Sampler
from runstate_tests.support.databases import create_database, drop_database, unique
from runstate_tests.support.deployment import (
    HOURLY_EXPORTS,
    HOURLY_MERGES,
    Deployment,
    Server,
    check_flush_after_restart,
    deployment_env,
)
from runstate_tests.support.devserver import (
    RUNSTATE,
    poll,
)
from runstate_tests.support.moto import MotoProcess

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deployment"), pytest.mark.timeout(2400)]

FIRST_FLUSH_S = 400  # the first run worker of a fresh server, on a loaded machine
# RUNSTATE_RUN_DEAD_AFTER_S of this server, the users' default: a paused worker is failed this soon. A
# shorter bound (it was 12 s) risks failing a live run whose beats are only late on a starved machine,
# where its replacement then starts a minute later.
DEAD_AFTER_S = 20
DATASET = "restart"
RUNS = """query($filter: RunsFilter) { runsOrError(filter: $filter) { ... on Runs { results {
  runId jobName status creationTime startTime endTime } } } }"""
RUN = """query($runId: ID!) { runOrError(runId: $runId) { ... on Run { status endTime } } }"""


@pytest.fixture
def server() -> Iterator[Server]:
    home = Path(tempfile.mkdtemp(prefix="runstate-restart-"))
    databases = [unique("rs_restart"), unique("rs_restart_dagster")]
    pg_url, dagster_url = (create_database(name) for name in databases)
    moto = MotoProcess()
    env = deployment_env(
        home,
        pg_url,
        dagster_url,
        moto.url,
        # On-demand runs, lingering long enough that they are still lingering when the server is stopped
        # (always-on runs through a restart: test_always_on).
        RUNSTATE_WAL_FLUSH_MODE="on-demand",
        RUNSTATE_WAL_FLUSH_LINGER_S="120",
        RUNSTATE_RUN_DEAD_AFTER_S=str(DEAD_AFTER_S),
        **HOURLY_EXPORTS,
        **HOURLY_MERGES,
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


def deployment_flush_runs(deployment: Deployment) -> list[dict]:
    return deployment.graphql(RUNS, {"filter": {"pipelineName": "flush_wal"}})["runsOrError"]["results"]


def flush_runs(deployment: Deployment) -> list[tuple[str, str]]:
    return [(run["runId"][:8], run["status"]) for run in deployment_flush_runs(deployment)]


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


def worker_pid(deployment: Deployment, run_id: str) -> int:
    """The process of a run's worker: the pid its RUN_START event was written from."""
    url = deployment.env["DAGSTER_PG_URL"].replace("+psycopg2", "")
    query = "SELECT event FROM event_logs WHERE run_id = %s AND dagster_event_type = 'PIPELINE_START'"
    with psycopg.connect(url) as conn:
        [event] = conn.execute(query, (run_id,)).fetchone()
    return deserialize_value(event, EventLogEntry).dagster_event.pid


def run_events(deployment: Deployment, run_id: str) -> list[str]:
    url = deployment.env["DAGSTER_PG_URL"].replace("+psycopg2", "")
    query = "SELECT dagster_event_type FROM event_logs WHERE run_id = %s AND dagster_event_type IS NOT NULL"
    with psycopg.connect(url) as conn:
        return [kind for (kind,) in conn.execute(query + " ORDER BY id", (run_id,))]


def pause_a_lingering_worker(server: Server, changes: list[Change]) -> float:
    """SIGSTOP the lingering flush run's worker past the dead bound, append, wait for the row; then SIGCONT
    the worker. Returns the seconds from the append to the row visible.

    Issue 42.1: the paused run is failed, the row is applied by the run that replaced it, and nothing
    is written for the paused run afterwards: its run stays FAILURE, with no success and no
    materialization after it. Issue 51: whoever declares the run dead kills its worker (and the
    worker's Spark JVM) before it reports the failure, so the worker is gone when the failure shows."""
    a_run_lingering(server)
    [paused] = lingering_runs(server.deployment)
    pid = worker_pid(server.deployment, paused)
    os.kill(pid, signal.SIGSTOP)
    try:
        visible_after = append_until_visible(server, changes, "while-paused", FIRST_FLUSH_S)
        assert ends(server.deployment, [paused])[paused[:8]][0] == "FAILURE"
        assert not alive(pid), f"run {paused} was failed while its worker {pid} was left frozen"
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed, and reaped by its parent
            os.kill(pid, signal.SIGCONT)
    assert ends(server.deployment, [paused])[paused[:8]][0] == "FAILURE"
    kinds = run_events(server.deployment, paused)
    after_failure = kinds[kinds.index("PIPELINE_FAILURE") :]
    assert "PIPELINE_SUCCESS" not in kinds and "ASSET_MATERIALIZATION" not in after_failure, kinds
    return visible_after


def restart_then_append(server: Server, sig: int, changes: list[Change]) -> float:
    """Stop mid-linger by `sig`, start again, append; returns the seconds from append to visible.

    SIGKILL goes to every process of the deployment, SIGTERM to `runstate dev` alone. After a SIGTERM,
    the runs that lingered must have recorded their own end before they exited (a run worker told to stop
    ends its run; `runstate dev` tells its run workers, as `dagster dev` does not), and so must every run
    that started once the shutdown had begun (issue 42.9: a flush run started after the daemon stopped,
    and was left STARTED)."""
    a_run_lingering(server)
    lingering = lingering_runs(server.deployment)
    stopping = time.time()
    server.stop(sig, everyone=sig != signal.SIGTERM)
    stopped = time.time()
    server.start()
    if sig == signal.SIGTERM:
        recorded = ends(server.deployment, lingering)
        assert all(end is not None and end <= stopped for _, end in recorded.values()), recorded
        # Started while the old deployment stopped: a run that starts later is the restarted deployment's.
        late = [
            run
            for run in all_runs(server.deployment)
            if run["startTime"] is not None and stopping <= run["startTime"] <= stopped
        ]
        assert all(run["endTime"] is not None and run["endTime"] <= stopped for run in late), [
            (
                run["jobName"],
                run["status"],
                f"started {run['startTime'] - stopping:+.1f} s after the stop",
                f"ended {run['endTime'] - stopped:+.1f} s after runstate dev exited"
                if run["endTime"]
                else "no end",
            )
            for run in late
        ] + [f"runstate dev took {stopped - stopping:.1f} s to exit"]
    return append_after_restart(server, changes, f"after-{signal.Signals(sig).name}", since=stopped)


def append_after_restart(server: Server, changes: list[Change], key: str, *, since: float) -> float:
    """Append one change after a restart and hold its flush run, the first created since `since`, to
    RESTART_BOUND_S (check_flush_after_restart). Returns the seconds from the append to the row visible."""
    appended = time.time()
    took = append_until_visible(server, changes, key, FIRST_FLUSH_S)
    runs = [run for run in deployment_flush_runs(server.deployment) if run["creationTime"] >= since]
    first = min(runs, key=lambda run: run["creationTime"])
    with explained(server), timeline(server, runs, appended):
        check_flush_after_restart(key, appended, first["creationTime"], first["startTime"], took)
    return took


@contextlib.contextmanager
def timeline(server: Server, runs: list[dict], appended: float) -> Iterator[None]:
    """A failed bound says what each flush run since the restart did, in seconds from the append, and
    why any of them failed."""
    try:
        yield
    except AssertionError as exc:

        def at(epoch: float | None) -> str:
            return "-" if epoch is None else f"{epoch - appended:+.1f} s"

        lines = [
            f"{run['runId'][:8]} {run['status']}: created {at(run['creationTime'])}, "
            f"started {at(run['startTime'])}, ended {at(run['endTime'])}; {failure_messages(server, run['runId'])}"
            for run in sorted(runs, key=lambda run: run["creationTime"])
        ]
        raise AssertionError(
            "\n".join(
                [
                    str(exc),
                    f"flush runs since the restart (the append at {time.strftime('%H:%M:%S', time.gmtime(appended))}):",
                    *lines,
                ]
            )
        ) from None


def failure_messages(server: Server, run_id: str) -> list[str]:
    """The run's event kinds, then its warnings and errors (failures, retries, a dataset not flushed),
    each with its time."""
    url = server.deployment.env["DAGSTER_PG_URL"].replace("+psycopg2", "")
    query = "SELECT event FROM event_logs WHERE run_id = %s ORDER BY id"
    with psycopg.connect(url) as conn:
        entries = [deserialize_value(event, EventLogEntry) for (event,) in conn.execute(query, (run_id,))]
    worrying = [
        f"{time.strftime('%H:%M:%S', time.gmtime(entry.timestamp))} {entry.message[:300]}"
        for entry in entries
        if entry.level >= logging.WARNING
    ]
    return [*run_events(server.deployment, run_id), *worrying]


def append_until_visible(server: Server, changes: list[Change], key: str, timeout: float) -> float:
    """Append one change and wait until its row is visible; returns the seconds that took."""
    change = Change.upsert(key, len(changes) + 1)
    changes.append(change)
    appended = time.monotonic()
    seq = append(server.deployment, change.key, change.value)
    with explained(server):
        poll(
            lambda: visible_at(server.deployment, seq),
            timeout=timeout,
            every=0.5,
            what=f"row {seq} ({key}) visible",
        )
    return time.monotonic() - appended


def all_runs(deployment: Deployment) -> list[dict]:
    return deployment.graphql(RUNS, {"filter": {}})["runsOrError"]["results"]


def test_a_restart_mid_linger_applies_new_rows_within_a_minute_and_every_row_once(server: Server):
    server.start()
    dagster_db = server.deployment.env["DAGSTER_PG_URL"].replace("+psycopg2", "")
    with Sampler(dagster_db, lambda: server.process.pid if server.process else None) as sampler:
        changes = [Change.upsert("before", 0)]
        seq = append(server.deployment, "before", 0)
        poll(
            lambda: visible_at(server.deployment, seq), timeout=FIRST_FLUSH_S, every=1, what="the first flush"
        )

        while_paused = pause_a_lingering_worker(server, changes)
        after_kill = restart_then_append(server, signal.SIGKILL, changes)
        after_term = restart_then_append(server, signal.SIGTERM, changes)

    applied_once(server.deployment, changes)
    peaks = sampler.peaks
    print(
        f"runstate dev: append-to-visible with the lingering worker paused {while_paused:.1f} s, after a "
        f"restart: SIGKILL {after_kill:.1f} s, SIGTERM {after_term:.1f} s; peak Spark JVMs {peaks.spark_jvms},"
        f" max runs per shard at once {peaks.runs_per_shard} ({peaks.samples} samples)"
    )
    assert peaks.runs_per_shard == 1, peaks.runs_per_shard_sample
    assert "terminate called" not in server.deployment.log.read_text(errors="replace")
