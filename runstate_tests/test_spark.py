"""The Spark session: Iceberg runtime, the `lake` catalog as a JDBC catalog in Postgres, pass-through conf."""

from __future__ import annotations

import psycopg
import pytest

from runstate.config import Settings
from runstate.spark import CATALOG, LOG_CONFIG, SparkSettings, SparkSetupError, jdbc_url, spark_config


@pytest.mark.spark
def test_an_iceberg_table_in_the_lake_catalog_is_written_and_read_back(
    spark, spark_settings, iceberg_namespace, pg_database
):
    table = f"{CATALOG}.{iceberg_namespace}.orders"
    spark.sql(f"CREATE TABLE {table} (id BIGINT, item STRING) USING iceberg")

    spark.createDataFrame([(1, "apple"), (2, "pear"), (3, "fig")], "id BIGINT, item STRING").writeTo(
        table
    ).append()
    rows = spark.table(table).orderBy("id").collect()

    assert [(row.id, row.item) for row in rows] == [(1, "apple"), (2, "pear"), (3, "fig")]
    assert spark.sql(f"SELECT count(*) AS n FROM {table}.snapshots").collect()[0].n == 1
    # The catalog lives in Postgres: Iceberg's JDBC catalog keeps its pointer rows there.
    assert spark_settings.is_jdbc
    with psycopg.connect(pg_database) as conn:
        pointer = conn.execute(
            "SELECT metadata_location FROM iceberg_tables"
            " WHERE catalog_name = %s AND table_namespace = %s AND table_name = 'orders'",
            (CATALOG, iceberg_namespace),
        ).fetchone()
    assert pointer is not None and pointer[0].endswith(".metadata.json")


@pytest.mark.spark
def test_the_session_binds_to_loopback_with_a_1g_driver(spark):
    conf = spark.sparkContext.getConf()

    assert conf.get("spark.driver.host") == "127.0.0.1"
    assert conf.get("spark.driver.bindAddress") == "127.0.0.1"
    assert conf.get("spark.driver.memory") == "1g"
    assert conf.get("spark.ui.enabled") == "false"
    assert "iceberg-spark-runtime-3.5_2.12-1.10.2.jar" in conf.get("spark.jars")


def test_runstate_spark_conf_passes_through_and_wins(tmp_path):
    settings = Settings.from_env(
        {
            "RUNSTATE_SPARK_MASTER": "spark://cluster:7077",
            "RUNSTATE_SPARK_CONF": '{"spark.driver.memory": "4g", "spark.executor.cores": 2}',
        }
    )
    spark_settings = SparkSettings(
        master=settings.spark_master, extra_conf=settings.spark_conf, warehouse_dir=tmp_path
    )

    conf = spark_settings.conf()

    assert spark_settings.master == "spark://cluster:7077"
    assert conf["spark.driver.memory"] == "4g"
    assert conf["spark.executor.cores"] == "2"


@pytest.mark.parametrize(
    ("java_options", "expected"),
    [
        (None, f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}"),
        ("-Xss4m", f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()} -Xss4m"),
        (
            "-Dlog4j2.configurationFile=file:/etc/mine.properties",
            "-Dlog4j2.configurationFile=file:/etc/mine.properties",
        ),
    ],
)
def test_the_driver_logs_through_runstates_file_unless_the_user_names_one(java_options, expected, tmp_path):
    extra = {} if java_options is None else {"spark.driver.extraJavaOptions": java_options}

    conf = SparkSettings(extra_conf=extra, warehouse_dir=tmp_path).conf()

    assert conf["spark.driver.extraJavaOptions"] == expected
    assert LOG_CONFIG.is_file()


def test_a_spark_conf_that_is_not_a_json_object_is_refused():
    with pytest.raises(ValueError, match="RUNSTATE_SPARK_CONF must be a JSON object"):
        Settings.from_env({"RUNSTATE_SPARK_CONF": '["spark.driver.memory", "4g"]'})


def test_the_hadoop_catalog_is_the_fallback(tmp_path):
    conf = SparkSettings(
        catalog_kind="hadoop", pg_url="postgresql://postgres@127.0.0.1:5432/x", warehouse_dir=tmp_path
    ).catalog_conf()

    assert conf[f"spark.sql.catalog.{CATALOG}.type"] == "hadoop"
    assert conf[f"spark.sql.catalog.{CATALOG}.warehouse"] == tmp_path.resolve().as_uri()
    assert f"spark.sql.catalog.{CATALOG}.catalog-impl" not in conf


def test_the_spark_resource_is_dagster_pysparks_lazy_resource_configured_from_the_settings(
    monkeypatch, tmp_path
):
    from dagster_pyspark import LazyPySparkResource

    from runstate.config import settings
    from runstate.defs.resources import spark_resource

    monkeypatch.setenv("RUNSTATE_SPARK_MASTER", "local[1]")
    monkeypatch.setenv("RUNSTATE_SPARK_CONF", '{"spark.executor.cores": "3"}')
    monkeypatch.setenv("RUNSTATE_WAREHOUSE", str(tmp_path))
    settings.cache_clear()
    try:
        resource = spark_resource()
    finally:
        settings.cache_clear()

    assert isinstance(resource, LazyPySparkResource)
    assert resource.spark_config["spark.master"] == "local[1]"
    assert resource.spark_config["spark.executor.cores"] == "3"
    assert resource.spark_config["spark.sql.catalog.lake.warehouse"] == tmp_path.resolve().as_uri()
    assert resource.spark_config["spark.driver.memory"] == "1g"


def test_the_shorthand_fields_build_the_same_config_as_the_settings(tmp_path):
    from runstate.defs.spark import SparkResource

    url = "postgresql://postgres@127.0.0.1:5432/x"
    resource = SparkResource(master="local[1]", pg_url=url, warehouse_dir=str(tmp_path))

    assert resource.spark_config == spark_config(
        SparkSettings(master="local[1]", pg_url=url, warehouse_dir=tmp_path)
    )


@pytest.mark.parametrize(
    "master, host",
    [
        ("local[2]", "127.0.0.1"),
        ("spark://127.0.0.1:7077", "127.0.0.1"),
        ("spark://localhost:7077,127.0.0.1:7078", "127.0.0.1"),
        ("spark://spark-master.internal:7077", None),
        ("yarn", None),
        ("k8s://https://10.0.0.1:443", None),
    ],
)
def test_the_driver_is_on_loopback_only_when_every_executor_is(master, host, tmp_path):
    conf = SparkSettings(master=master, warehouse_dir=tmp_path).conf()

    assert conf.get("spark.driver.host") == host
    assert conf.get("spark.driver.bindAddress") == host


def test_runstate_spark_driver_host_names_the_drivers_address():
    settings = Settings.from_env(
        {"RUNSTATE_SPARK_MASTER": "yarn", "RUNSTATE_SPARK_DRIVER_HOST": "10.1.2.3", "RUNSTATE_WAREHOUSE": "w"}
    )

    conf = spark_config(SparkSettings.from_settings(settings))

    assert conf["spark.master"] == "yarn"
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "10.1.2.3"


def test_a_driver_host_that_is_a_url_is_refused():
    from runstate.config import ConfigError

    with pytest.raises(ConfigError, match="RUNSTATE_SPARK_DRIVER_HOST must be a host name or address"):
        Settings.from_env({"RUNSTATE_SPARK_DRIVER_HOST": "http://10.1.2.3"})


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        (
            "postgresql://app:s3cret@db.internal:6432/runstate",
            ("jdbc:postgresql://db.internal:6432/runstate", "app", "s3cret"),
        ),
        (
            "postgresql+psycopg2://u@h/d?sslmode=require",
            ("jdbc:postgresql://h:5432/d?sslmode=require", "u", None),
        ),
        (
            "host=10.0.0.5 port=5433 dbname=events user=ops password=p%40ss",
            ("jdbc:postgresql://10.0.0.5:5433/events", "ops", "p%40ss"),
        ),
        ("postgresql://ops@localhost", ("jdbc:postgresql://localhost:5432/ops", "ops", None)),
    ],
)
def test_a_dsn_in_either_libpq_form_becomes_the_jdbc_url_spark_reads_postgres_with(dsn, expected):
    assert jdbc_url(dsn) == expected


def test_a_dsn_through_a_unix_socket_is_refused_for_spark_with_a_clear_error():
    with pytest.raises(
        SparkSetupError, match="over TCP, not through the socket directory '/var/run/postgresql'"
    ):
        jdbc_url("host=/var/run/postgresql dbname=runstate")
