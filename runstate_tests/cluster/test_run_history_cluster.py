"""The run history's model check on a standalone Spark cluster: exports whose Iceberg writes and runs
merges run as tasks on two executors (other JVMs and Python workers than the driver's), one executor
SIGKILLed in the middle of an export in the later rounds, exports repeated; after every round the lake
equals the feed from position 0, row for row, and `runs` the aggregate of the feed.

A killed executor costs its tasks a retry on another executor (the worker starts a new one): a task's
files join a table only through the driver's one commit, so none of them is written twice.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from runstate.eventstore.lake import export_history
from runstate_tests.support.lake import (
    SMALL_BATCHES,
    append_randomly,
    assert_lake_equals_feed,
    exported_to_the_end,
)

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark_cluster"), pytest.mark.timeout(1800)]
# The root conftest's history and own_store run on the package's cluster session: a namespace and a store
# of the test's own.
ROUNDS = 3
SEED = 20261128


def executor_pids(app_id: str) -> dict[str, int]:
    """The executor JVMs of the application by executor id (its workers start them in their own sessions)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in command
            and app_id.encode() in command
        ):
            found[command[command.index(b"--executor-id") + 1].decode()] = int(proc.name)
    return found


def kill_a_busy_executor(executors, app_id: str, exporting: threading.Thread) -> bool:
    """SIGKILL an executor while it runs a task of the export; False if the export ended first.

    Waiting for a busy executor, not a fixed time: on a quiet machine an export can end within the
    seconds a fixed wait chose, and the round would kill nothing."""
    while exporting.is_alive():
        busy = executors.busy()
        pids = executor_pids(app_id) if busy else {}  # the /proc scan only once the UI shows a task
        victims = [pids[executor] for executor in busy if executor in pids]
        if victims and exporting.is_alive():
            os.kill(victims[0], signal.SIGKILL)
            return True
        time.sleep(0.02)
    return False


def _export_into(outcome: dict, spark, store, history) -> None:
    try:
        outcome["steps"] = list(export_history(spark, store, history))
    except Exception as error:  # noqa: BLE001 - a killed executor may fail a stage: the test reports it
        outcome["error"] = error


def test_exports_on_the_cluster_survive_a_killed_executor_exactly_once(spark, own_store, history, executors):
    rng = random.Random(SEED)
    history = replace(history, batch_events=SMALL_BATCHES)  # many commits and merges: jobs to kill into
    app_id = spark.sparkContext.applicationId
    kills_mid_export = 0
    for round_ in range(ROUNDS):
        append_randomly(own_store, rng, runs=50, appends=rng.randint(40, 80))
        before = executors.counts()
        outcome: dict = {}
        exporting = threading.Thread(target=_export_into, args=(outcome, spark, own_store, history))
        exporting.start()
        if round_ > 0:  # the first round shows the work runs on both executors; the others kill one
            time.sleep(rng.uniform(0.0, 1.0))  # a later job of the export than its first, now and then
            kills_mid_export += kill_a_busy_executor(executors, app_id, exporting)
        exporting.join(timeout=900)
        assert not exporting.is_alive(), "the export never ended"
        if round_ == 0:
            assert "error" not in outcome, outcome.get("error")
            executors.wait_until_each_ran_tasks_since(before)

        exported_to_the_end(spark, own_store, history)
        repeated = list(export_history(spark, own_store, history))

        assert repeated == [], f"round {round_}: a repeated export wrote {repeated}"
        assert_lake_equals_feed(spark, own_store, history)
    print(f"an executor killed mid-export in {kills_mid_export} of {ROUNDS - 1} rounds")
    assert kills_mid_export >= 1, "no executor was killed while an export ran"
