"""Shared fixtures: a real Postgres database, moto's server, fakesnow's server and one Spark session (their
helpers, shared with bench/, in runstate_tests/support).

Every test gets its own namespace (a Postgres schema, a Snowflake schema, uniquely named AWS
resources) and it is dropped afterwards, so tests and parallel workers never collide.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from hypothesis import settings as hypothesis_settings
from psycopg import sql

from runstate_tests.support.dagster import load_alembic_scripts_once
from runstate_tests.support.databases import (
    DatabasesMadeAhead,
    create_database,
    create_migrated_database,
    drop_database,
    unique,
)
from runstate_tests.support.jvm_archive import sharing_options, start_archive
from runstate_tests.support.moto import MotoProcess
from runstate_tests.support.spark import SHORT_LIVED_JVM_OPTIONS, drop_iceberg_table

if TYPE_CHECKING:  # runstate itself is imported after the environment below is set
    from runstate.eventstore import PostgresEventStore, SnowflakeEventStore
    from runstate.eventstore.lake import HistoryConfig
    from runstate.maintenance.identifiers import TableRef
    from runstate_tests.support.commit_fence import CommitHold
    from runstate_tests.support.wal import Feed, WalEnv

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("DAGSTER_TELEMETRY_ENABLED", "false")


def _process_temp_dir(prefix: str) -> str:
    """A directory of this test process's own, removed when the process ends."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


# Hermetic: the developer's .runstate/env (from `services up`) must not leak endpoints into tests.
os.environ["RUNSTATE_HOME"] = _process_temp_dir("runstate-test-home-")
# Ticks use the deployment's instance; in tests that is an empty home (SQLite) of the worker's own, never the
# checkout's dagster.yaml and the shared `dagster` database. Tests of the deployment's instance set their own.
os.environ["DAGSTER_HOME"] = _process_temp_dir("runstate-test-dagster-")
# Spark drivers of the suite are short-lived JVMs (support/spark.py says why these options), which map one
# class archive (pytest_configure, below). A value of the user's own is left as it is.
_OWN_JVM_OPTIONS = "SPARK_SUBMIT_OPTS" not in os.environ
os.environ.setdefault("SPARK_SUBMIT_OPTS", SHORT_LIVED_JVM_OPTIONS)

# A suite started in the background (`make test &`, a CI runner) inherits SIGINT ignored. Dagster maps
# SIGTERM to SIGINT's handler whenever it executes a run in-process, so after the first such test SIGTERM
# would be ignored too, and every child spawned afterwards inherits that: Pool.terminate() and
# Process.terminate() then wait forever. Tests start from Python's own dispositions instead.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)

# Hypothesis fails an example that takes over 200 ms by default: on two cores shared by three workers and
# their JVMs, a boto3 client or a Spark call takes that now and then, and the test then fails one run in
# ten for no fault of the code. Examples are judged by what they check, never by their time.
hypothesis_settings.register_profile("runstate", deadline=None)
hypothesis_settings.load_profile("runstate")


# Dagster's alembic scripts are read once per test process (support/dagster.py says why).
load_alembic_scripts_once()


def pytest_configure(config: pytest.Config) -> None:
    """xdist hands out its groups largest first unless told not to; the collection order below is the plan.

    A group of more tests would otherwise go before the Spark-cluster group, whose session must be the
    first of its worker's process (runstate_tests/cluster/conftest.py).
    """
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    _share_spark_classes(config)


def _share_spark_classes(config: pytest.Config) -> None:
    """Every Spark driver of the suite maps one class archive (support/jvm_archive.py), made once per
    checkout and Java; the workers, started after this, and their children inherit the options."""
    if not _OWN_JVM_OPTIONS or hasattr(config, "workerinput"):
        return
    archive = start_archive(SHORT_LIVED_JVM_OPTIONS)
    if archive is not None:
        os.environ["SPARK_SUBMIT_OPTS"] = f"{SHORT_LIVED_JVM_OPTIONS} {sharing_options(archive)}"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest tests first, and xdist groups honoured (the deployment tests share one `runstate dev`).

    Under `--dist loadgroup` the collection order is the order in which work is handed out: a worker
    asks for more whenever it runs low. Started first, the serialised groups and the slow tests run
    while the other workers work through the short ones, so no worker ends the suite alone on a long
    test. Spark tests are not grouped: each worker starts its own session (about 1.5 GB), and spreading
    them over the workers shortens the suite's longest path.

    `make test` runs three workers on two cores: the deployment group's worker mostly waits (for the
    daemon's timers, runs and restarts, whose CPU is the deployment's own processes), so two workers kept
    the cores 86% busy and a third keeps them 96% busy (one run each on one host: 8:22 and 7:38).
    """
    items.sort(key=_start_rank)  # stable: within a rank, modules and their tests keep their order
    if getattr(config.option, "loadgroup", False):  # set in xdist workers under --dist loadgroup
        _suffix_xdist_groups(items)


def _start_rank(item: pytest.Item) -> tuple[int, bool]:
    """0: a serialised xdist group; 1: marked slow (a server, a JVM or a demo of its own); 2: Spark.

    Within a rank, the tests of the shared `runstate dev` (the deployment package's `deployment` fixture)
    come after those that start a deployment of their own, so the shared one starts once they are done:
    started by the first test of the package, it idled beside the plain-instance and restart tests, two
    deployments on two cores."""
    shares_deployment = "deployment" in getattr(item, "fixturenames", ())
    for rank, marker in enumerate(("xdist_group", "slow", "spark")):
        if item.get_closest_marker(marker):
            return rank, shares_deployment
    return 3, shares_deployment


def _suffix_xdist_groups(items: list[pytest.Item]) -> None:
    """What `--dist loadgroup` relies on: a group's name as the node id's `@suffix`.

    pytest-xdist 3.8 writes the suffix to `item._nodeid`, which pytest 9 no longer reads (the id lives in
    `item._id`), so every group was spread over the workers: one JVM per worker, one deployment per worker.
    """
    from _pytest.nodeid import NodeId

    for item in items:
        groups = sorted(
            {
                str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                for mark in item.iter_markers("xdist_group")
            }
        )
        if groups and "@" not in item.nodeid:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(groups)}")


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """One database per test worker; tests isolate themselves inside it with `pg_schema`."""
    name = unique("rs_test")
    dsn = create_database(name)
    yield dsn
    drop_database(name)


@pytest.fixture(scope="session")
def databases_made_ahead() -> Iterator[dict[str, DatabasesMadeAhead]]:
    supplies = {
        "empty": DatabasesMadeAhead("rs_fresh", create_database),
        "migrated": DatabasesMadeAhead("rs_migrated", create_migrated_database),
    }
    yield supplies
    for supply in supplies.values():
        supply.close()


@pytest.fixture
def fresh_database(databases_made_ahead: dict[str, DatabasesMadeAhead]) -> Iterator[str]:
    """A database of the test's own, for tests that need an empty server-side namespace (made while the
    test before ran)."""
    name, url = databases_made_ahead["empty"].take()
    yield url
    databases_made_ahead["empty"].drop(name)


@pytest.fixture
def migrated_database(databases_made_ahead: dict[str, DatabasesMadeAhead]) -> Iterator[str]:
    """A database of the test's own whose schema `runstate` holds every migration (no event partitions),
    copied from a template migrated once and made while the test before ran (support/databases.py), for
    tests that need a migrated store in a database no other test touches."""
    name, url = databases_made_ahead["migrated"].take()
    yield url
    databases_made_ahead["migrated"].drop(name)


@pytest.fixture
def dagster_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Dagster instance of the test's own on disk (DAGSTER_HOME), which child processes open too.

    Never the checkout's dagster.yaml without DAGSTER_HOME: its storage is the server's shared `dagster`
    database, where another worker's merge run holds a merge shard this test needs."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.fixture
def pg_schema(pg_database: str) -> Iterator[str]:
    """A unique schema name in the worker's database, dropped after the test."""
    schema = unique("t")
    yield schema
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's real HTTP server, as `runstate services up` runs it."""
    moto = MotoProcess()
    yield moto.url
    moto.stop()


@pytest.fixture
def dynamodb(moto_endpoint: str):
    import boto3

    return boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")


@pytest.fixture
def s3(moto_endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")


@pytest.fixture(scope="session")
def fakesnow_server() -> Iterator[dict]:
    """fakesnow's server, as `runstate services` runs it; the dict is connection kwargs for
    snowflake.connector.connect."""
    import fakesnow

    from runstate.services.fakesnow_errors import answer_statement_errors_as_snowflake

    answer_statement_errors_as_snowflake()
    with fakesnow.server() as conn_kwargs:
        # The connector probes cloud metadata endpoints (AWS, Azure, GCP, in threads) at every connect
        # unless told not to; fakesnow on loopback has no platform to find.
        yield {**conn_kwargs, "platform_detection_timeout_seconds": 0.0}


@pytest.fixture
def snowflake_schema(fakesnow_server: dict) -> Iterator[tuple[dict, str]]:
    """Connection kwargs (database RUNSTATE_TEST) and a unique schema name of the test's own."""
    import snowflake.connector

    schema = unique("T").upper()
    kwargs = {**fakesnow_server, "database": "RUNSTATE_TEST"}
    conn = snowflake.connector.connect(**kwargs)
    conn.cursor().execute("CREATE DATABASE IF NOT EXISTS RUNSTATE_TEST")
    yield kwargs, schema
    conn.cursor().execute(f"DROP SCHEMA IF EXISTS RUNSTATE_TEST.{schema} CASCADE")
    conn.close()


@pytest.fixture
def snowflake_settings(snowflake_schema, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[dict, str]]:
    """The settings (SNOWFLAKE_*, RUNSTATE_EVENTSTORE=snowflake) of the test's fakesnow schema: what
    `snowflake_schema` gives."""
    from runstate.config import settings

    kwargs, schema = snowflake_schema
    for key in ("account", "user", "password", "database", "host", "port", "protocol"):
        monkeypatch.setenv(f"SNOWFLAKE_{key.upper()}", str(kwargs[key]))
    monkeypatch.setenv("SNOWFLAKE_SCHEMA", schema)
    monkeypatch.setenv("RUNSTATE_EVENTSTORE", "snowflake")
    settings.cache_clear()
    yield kwargs, schema
    settings.cache_clear()


@pytest.fixture(scope="session")
def spark_settings(pg_database: str, tmp_path_factory: pytest.TempPathFactory):
    from runstate.spark import SparkSettings

    warehouse: Path = tmp_path_factory.mktemp("warehouse")
    return SparkSettings(pg_url=pg_database, warehouse_dir=warehouse, app_name="runstate-tests")


@pytest.fixture(scope="session")
def spark(spark_settings):
    """One Spark session per test worker: startup costs seconds."""
    from runstate.spark import build_session

    session = build_session(spark_settings)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def iceberg_namespace(spark, spark_settings) -> Iterator[str]:
    """A unique Iceberg namespace in the `lake` catalog, dropped with its tables after the test."""
    namespace = unique("ns")
    spark.sql(f"CREATE NAMESPACE lake.{namespace}")
    yield namespace
    for row in spark.sql(f"SHOW TABLES IN lake.{namespace}").collect():
        drop_iceberg_table(spark, spark_settings.warehouse_dir, namespace, row.tableName)
    spark.sql(f"DROP NAMESPACE IF EXISTS lake.{namespace}")
    shutil.rmtree(spark_settings.warehouse_dir / namespace, ignore_errors=True)


# Fixtures of more than one folder: the event store's (pg_store, sf_store), the run history's lake
# (own_store, history), the WAL's (wal, feed, dataset_ids) and the commit fence's (commit_hold,
# rewrite_job). The cluster tests request them on their own session, moto and store.


@pytest.fixture
def pg_store(pg_database: str, pg_schema: str) -> Iterator[PostgresEventStore]:
    from runstate.eventstore import PostgresEventStore

    store = PostgresEventStore(pg_database, schema=pg_schema)
    store.ensure_schema()
    yield store
    store.close()


@pytest.fixture
def sf_store(snowflake_schema) -> Iterator[SnowflakeEventStore]:
    from runstate.eventstore import SnowflakeEventStore

    kwargs, schema = snowflake_schema
    store = SnowflakeEventStore(connect_kwargs=kwargs, schema=schema)
    store.ensure_schema()
    yield store
    store.close()


@pytest.fixture
def own_store(migrated_database: str) -> Iterator[PostgresEventStore]:
    """A store in a database of the test's own: its feed waits for no transaction of another test (nor for
    the catalog's commits, whose tables live in the worker's database)."""
    from runstate.eventstore import PostgresEventStore

    store = PostgresEventStore(migrated_database, schema="runstate")
    store.ensure_schema()
    yield store
    store.close()


@pytest.fixture
def history(spark, spark_settings) -> Iterator[HistoryConfig]:
    """A HistoryConfig on a namespace of the test's own; `SMALL_BATCHES` of it makes an export commit often."""
    from runstate.eventstore.lake import HistoryConfig

    config = HistoryConfig(namespace=unique("hist"), batch_events=1000)
    yield config
    for table in ("run_events", "runs"):
        drop_iceberg_table(spark, spark_settings.warehouse_dir, config.namespace, table)
    spark.sql(f"DROP NAMESPACE IF EXISTS lake.{config.namespace}")
    shutil.rmtree(spark_settings.warehouse_dir / config.namespace, ignore_errors=True)


@pytest.fixture
def wal(moto_endpoint: str, dynamodb: Any, s3: Any) -> Iterator[WalEnv]:
    """A WAL table and blob bucket of the test's own on moto's server."""
    import boto3

    from runstate.wal import ensure_blob_bucket, ensure_wal_table
    from runstate_tests.support.wal import WalEnv

    env = WalEnv(
        endpoint=moto_endpoint,
        dynamodb=dynamodb,
        s3=s3,
        streams=boto3.client("dynamodbstreams", endpoint_url=moto_endpoint, region_name="us-east-1"),
        table=f"wal_{uuid.uuid4().hex[:10]}",
        bucket=f"blobs-{uuid.uuid4().hex[:12]}",
    )
    ensure_wal_table(dynamodb, env.table)
    ensure_blob_bucket(s3, env.bucket)
    yield env
    dynamodb.delete_table(TableName=env.table)


@pytest.fixture
def feed(wal: WalEnv) -> Feed:
    from runstate_tests.support.wal import Feed

    return Feed(wal)


@pytest.fixture
def dataset_ids(spark, spark_settings) -> Iterator[Callable[[str], str]]:
    """new_id(stem) -> a unique dataset id; every table made for one is dropped after the test."""
    from runstate.wal.dataset_tables.naming import NAMESPACE, table_name

    made: list[str] = []

    def new_id(stem: str = "ds") -> str:
        made.append(f"{stem}{uuid.uuid4().hex[:8]}")
        return made[-1]

    yield new_id
    for dataset_id in made:
        drop_iceberg_table(spark, spark_settings.warehouse_dir, NAMESPACE, table_name(dataset_id))


@pytest.fixture
def commit_hold(pg_database: str, pg_schema: str, spark) -> Iterator[CommitHold]:
    """Holds the Iceberg commits of this schema's attempts (but those let through) until release()."""
    from runstate_tests.support.commit_fence import holding_commits

    with holding_commits(pg_database, pg_schema, spark) as hold:
        yield hold


@pytest.fixture
def rewrite_job(spark, iceberg_namespace: str, store) -> tuple[TableRef, list[tuple], str]:
    """(table, its rows, the id of a queued rewrite_data_files job on it): `store` is a MaintenanceStore."""
    from runstate_tests.support.commit_fence import queued_rewrite

    return queued_rewrite(spark, iceberg_namespace, store)
