"""One standalone Spark cluster (a master and two workers) and one Spark session on it, for the package:
both modules' tests share them (each start costs the cluster's three JVMs and two executors), and the
test of `down`, which stops the cluster, runs last.

The cluster is started the way `runstate services up --spark-workers 2` starts it (in this worker's own
RUNSTATE_HOME), and its daemons get no AWS variables: the blob reads in the executors' Python workers
must get the endpoint and credentials from the configuration. The session has its UI on a free loopback
port, so the tests can read each executor's task count from the executors REST endpoint.

PySpark allows one SparkContext per process, and the other Spark tests share a `local[2]` session per
test worker: these tests are one xdist group, and xdist (`--dist loadgroup`) hands each worker the
largest groups first (this one is collected first, so a tie goes its way), so with no more than one
larger group their worker runs them before any other Spark test; the session stops with the package.
If that ever fails, the `spark` fixture below says so instead of running on the wrong master.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from runstate.maintenance.store import MaintenanceStore
from runstate.services import spark_cluster
from runstate.services.state import free_port
from runstate_tests.deployment.gate import GatedMotoServer
from runstate_tests.support.cluster import WORKERS, Executors
from runstate_tests.support.devserver import poll
from runstate_tests.support.spark import SHORT_LIVED_JVM_OPTIONS
from runstate_tests.support.wal import WalEnv

CLUSTER_DIR = Path(__file__).parent


# The one test that stops the cluster: every other test of the package runs before it.
STOPS_THE_CLUSTER = "test_down_stops_every_daemon_with_its_executors_and_python_workers"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The cluster group first: it is the longest unit, and its session must be its worker's first."""
    ours = [item for item in items if CLUSTER_DIR in Path(str(item.path)).parents]
    ours.sort(key=lambda item: item.name == STOPS_THE_CLUSTER)  # stable: the rest keep their order
    if ours:
        first = {id(item) for item in ours}
        items[:] = ours + [item for item in items if id(item) not in first]


@pytest.fixture(scope="package")
def cluster() -> Iterator[spark_cluster.StandaloneCluster]:
    env = spark_cluster.up({}, WORKERS)
    standalone = spark_cluster.load_cluster()
    assert standalone is not None and env == {"RUNSTATE_SPARK_MASTER": standalone.url}
    yield standalone
    spark_cluster.down()


@pytest.fixture(scope="package")
def gated_moto() -> Iterator[GatedMotoServer]:
    """moto for the package, with a gate that can hold chosen requests (a blob read, mid-merge)."""
    server = GatedMotoServer()
    yield server
    server.stop()


@pytest.fixture(scope="package")
def spark_settings(cluster, pg_database: str, tmp_path_factory: pytest.TempPathFactory):
    from runstate.spark import SparkSettings

    return SparkSettings(
        master=cluster.url,
        pg_url=pg_database,
        warehouse_dir=tmp_path_factory.mktemp("cluster-warehouse"),
        app_name="runstate-cluster-tests",
        extra_conf={
            "spark.ui.enabled": "true",
            "spark.ui.port": str(free_port()),
            # The driver's options (and class archive, when the root conftest made one): SPARK_SUBMIT_OPTS.
            "spark.executor.extraJavaOptions": os.environ.get("SPARK_SUBMIT_OPTS", SHORT_LIVED_JVM_OPTIONS),
        },
    )


@pytest.fixture(scope="package")
def spark(spark_settings):
    """The package's session on the cluster, once both executors have registered."""
    from pyspark import SparkContext

    from runstate.spark import build_session

    active = SparkContext._active_spark_context
    if active is not None:
        raise RuntimeError(
            f"a Spark session ({active.master}) already runs in this test process: the cluster tests "
            "must run before every other Spark test of their worker (they are collected first)"
        )
    previous = os.environ.get("SPARK_LOCAL_IP")
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # the driver's UI binds it (no Spark setting does)
    session = build_session(spark_settings)
    session.sparkContext.setLogLevel("ERROR")
    try:
        poll(
            lambda: len(Executors(session).counts()) >= WORKERS, timeout=300, every=0.5, what="two executors"
        )
        yield session
    finally:
        session.stop()
        if previous is None:
            os.environ.pop("SPARK_LOCAL_IP", None)
        else:
            os.environ["SPARK_LOCAL_IP"] = previous


@pytest.fixture
def store(pg_database: str, pg_schema: str) -> Iterator[MaintenanceStore]:
    """The maintenance tests' store (runstate_tests/maintenance/conftest.py), for the fence tests here;
    their other fixtures (commit_hold, rewrite_job, dataset_ids) are the root conftest's, on this
    package's session."""
    with MaintenanceStore(pg_database, schema=pg_schema) as store:
        store.ensure_schema()
        yield store


@pytest.fixture
def executors(spark) -> Executors:
    return Executors(spark)


@pytest.fixture
def wal(gated_moto: GatedMotoServer) -> Iterator[WalEnv]:
    """A WAL table and blob bucket of the test's own, on the gated moto."""
    from runstate.wal import ensure_blob_bucket, ensure_wal_table

    def client(service: str) -> Any:
        return boto3.client(service, endpoint_url=gated_moto.url, region_name="us-east-1")

    env = WalEnv(
        endpoint=gated_moto.url,
        dynamodb=client("dynamodb"),
        s3=client("s3"),
        streams=client("dynamodbstreams"),
        table=f"wal_{uuid.uuid4().hex[:10]}",
        bucket=f"blobs-{uuid.uuid4().hex[:12]}",
    )
    ensure_wal_table(env.dynamodb, env.table)
    ensure_blob_bucket(env.s3, env.bucket)
    yield env
    env.dynamodb.delete_table(TableName=env.table)
