"""`services up --spark-workers N` decisions that start nothing (the cluster itself: runstate_tests/cluster)."""

from __future__ import annotations

import pytest

from runstate.services import spark_cluster
from runstate.services.state import ServiceError


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
