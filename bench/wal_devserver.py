"""A `runstate dev` of the WAL benchmarks' own (webserver + daemon + services), and where a flush's time goes.

The dev server gets a scratch Postgres database (Dagster storage and the event store), a RUNSTATE_HOME
of its own (its own moto, fakesnow and `.env`) and a DAGSTER_HOME holding a copy of the
repository's dagster.yaml, so the queue, tag limits and run monitoring are the deployed ones.
Readiness is polled (GraphQL `{version}`), never assumed after a sleep.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

from common import create_database, drop_database

from runstate_tests.support.devserver import RUNSTATE, free_port, graphql_version, launch_dev

REPO_ROOT = Path(__file__).resolve().parent.parent
ADMIN_URL = os.environ.get("RUNSTATE_BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
# The caller's endpoints must not leak into the dev server: it starts services of its own.
SERVICE_VARS = (
    "RUNSTATE_PG_URL",
    "DAGSTER_PG_URL",
    "RUNSTATE_AWS_ENDPOINT_URL",
    "RUNSTATE_HOME",
    "DAGSTER_HOME",
)


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@dataclass
class DevServer:
    """A running `runstate dev`; `env` holds the endpoints it wrote (moto's URL, the WAL table...)."""

    process: subprocess.Popen
    port: int
    home: Path
    dagster_home: Path
    env: dict[str, str]
    log: Path

    def instance(self) -> Any:
        """The dev server's Dagster instance (same storage), to read run records and events."""
        import dagster as dg

        os.environ["DAGSTER_PG_URL"] = self.env["DAGSTER_PG_URL"]
        return dg.DagsterInstance.from_config(str(self.dagster_home))

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def start_dev(shards: int | None = None, ready_timeout: float = 300) -> Iterator[DevServer]:
    """A generator-based context: yields a ready DevServer, then stops it and drops what it made."""
    name, dsn = create_database(ADMIN_URL)
    home = Path(tempfile.mkdtemp(prefix="runstate-bench-"))
    dagster_home = home / "dagster_home"
    dagster_home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", dagster_home / "dagster.yaml")
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_VARS and not k.startswith("SNOWFLAKE_")}
    env.update(
        RUNSTATE_HOME=str(home),
        DAGSTER_HOME=str(dagster_home),
        RUNSTATE_PG_URL=dsn,
        DAGSTER_PG_URL=dsn.replace("postgresql://", "postgresql+psycopg2://", 1),
        DAGSTER_TELEMETRY_ENABLED="false",
    )
    if shards:
        env["RUNSTATE_WAL_FLUSH_SHARDS"] = str(shards)
    port = free_port()
    log = home / "dev.log"
    process = launch_dev(port, env, log, start_new_session=True, preexec_fn=_default_signals)
    try:
        deadline = time.monotonic() + ready_timeout
        while graphql_version(port) is None:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"runstate dev did not come up:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        written = _read_env(home / ".env")  # where `services up` writes the endpoints
        yield DevServer(process, port, home, dagster_home, {**env, **written}, log)
    finally:
        _stop(process)
        subprocess.run([RUNSTATE, "services", "down"], env=env, capture_output=True, timeout=120)
        drop_database(ADMIN_URL, name)
        shutil.rmtree(home, ignore_errors=True)


def _read_env(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            values[key.strip()] = value.strip()
    return values


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


# --- where a flush run's time goes -------------------------------------------------------------------------


@dataclass(frozen=True)
class RunTiming:
    """One flush run, from Dagster's run record and event log (epoch seconds)."""

    run_id: str
    shard: str
    created: float
    dequeued: float | None
    started: float | None  # RUN_START: the run worker has loaded the code location
    step_started: float | None
    ended: float | None

    @property
    def queue_wait_s(self) -> float | None:
        return None if self.dequeued is None else self.dequeued - self.created

    @property
    def run_start_s(self) -> float | None:
        """Launch to running: process start and code-location load."""
        return None if self.started is None or self.dequeued is None else self.started - self.dequeued

    @property
    def flush_s(self) -> float | None:
        return None if self.ended is None or self.step_started is None else self.ended - self.step_started


def flush_runs(instance: Any, since: float) -> list[RunTiming]:
    from datetime import datetime

    import dagster as dg

    created_after = datetime.fromtimestamp(since, tz=UTC)
    records = instance.get_run_records(
        filters=dg.RunsFilter(job_name="flush_wal", created_after=created_after)
    )
    timings = []
    for record in records:
        run_id = record.dagster_run.run_id
        events = {}
        for entry in instance.all_logs(run_id):
            if entry.dagster_event is not None:
                events.setdefault(entry.dagster_event.event_type_value, entry.timestamp)
        timings.append(
            RunTiming(
                run_id=run_id,
                shard=record.dagster_run.tags.get("runstate/wal_shard", "?"),
                created=record.create_timestamp.timestamp(),
                # The coordinator records the launch (STARTING) when it dequeues; DEQUEUED is not always written.
                dequeued=events.get("PIPELINE_DEQUEUED") or events.get("PIPELINE_STARTING"),
                started=events.get("PIPELINE_START"),
                step_started=events.get("STEP_START"),
                ended=events.get("STEP_SUCCESS") or events.get("STEP_FAILURE"),
            )
        )
    return sorted(timings, key=lambda timing: timing.created)


def median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return round(statistics.median(present), 2) if present else None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def load_average() -> float:
    return round(os.getloadavg()[0], 2)
