"""`services up --spark-workers N` decisions that start nothing, and the order workers start in (the
cluster at work: runstate_tests/cluster)."""

from __future__ import annotations

import contextlib
import socket

import pytest
from services_helpers import clean_env

from runstate.services import spark_cluster
from runstate.services.state import ServiceError, is_running


@pytest.fixture
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("RUNSTATE_HOME", str(tmp_path))
    return tmp_path


def test_no_cluster_is_started_over_a_master_the_caller_configured(home):
    with pytest.raises(
        ServiceError, match="RUNSTATE_SPARK_MASTER=spark://elsewhere:7077 names another cluster"
    ):
        spark_cluster.up({"RUNSTATE_SPARK_MASTER": "spark://elsewhere:7077"}, 2)

    assert spark_cluster.load_cluster() is None


@pytest.mark.parametrize("workers", [None, 0])
def test_without_workers_asked_for_nothing_starts_and_spark_stays_local(home, workers):
    assert spark_cluster.up({}, workers) == {}
    assert spark_cluster.load_cluster() is None and spark_cluster.status() == []


def test_more_workers_than_the_machine_runs_are_refused_before_anything_starts(services_home, runstate_cli):
    # Postgres does not answer here: a command that went as far as starting services would say so instead.
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    env = clean_env(services_home, RUNSTATE_PG_URL=f"postgresql://postgres@127.0.0.1:{closed_port}/runstate")

    up = runstate_cli("services", "up", "--spark-workers", "10000", env=env)

    assert up.returncode == 2, up.stderr
    assert "Invalid value for '--spark-workers': 10000 workers is more than this machine can run" in up.stderr
    assert f"at most {spark_cluster.max_workers()} (one per core" in up.stderr
    assert not (services_home / ".runstate").exists() and not (services_home / ".env").exists()


def test_the_python_api_refuses_them_too_and_keeps_what_runs(home):
    with pytest.raises(ServiceError, match="more than this machine can run"):
        spark_cluster.up({}, spark_cluster.max_workers() + 1)

    assert spark_cluster.load_cluster() is None


@pytest.mark.slow  # a master and two worker JVMs
def test_workers_start_a_wave_at_a_time_each_registered_before_the_next_starts(home):
    if spark_cluster.max_workers() < 2:
        pytest.skip("this machine runs one worker")
    steps: list[str] = []

    cluster = spark_cluster.StandaloneCluster.start(2, home / "spark", wave=1, log=steps.append)
    try:
        healthy = cluster.healthy()
        records = list(cluster.workers.values())
    finally:
        cluster.stop()

    assert [step.split(" ", 2)[:2] for step in steps] == [
        ["spark-worker-1", "started"],
        ["spark-worker-1", "registered"],
        ["spark-worker-2", "started"],
        ["spark-worker-2", "registered"],
    ]
    assert healthy and not any(is_running(record) for record in records)
