"""The Spark session with the Iceberg runtime and the `lake` catalog (no Dagster here).

The catalog is a JDBC catalog in Postgres when the Postgres JDBC driver is on disk, and a hadoop
warehouse on the local filesystem otherwise. Extra settings from RUNSTATE_SPARK_CONF win, so the
same code runs on a cluster by configuration alone: RUNSTATE_SPARK_MASTER names it, the Iceberg and
JDBC jars go to the executors through `spark.jars` (the driver serves them), and the driver's
address comes from RUNSTATE_SPARK_DRIVER_HOST (loopback by default when the master is).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from runstate.config import Settings, default_warehouse_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CATALOG = "lake"
ICEBERG_JAR_NAME = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
JDBC_JAR_CANDIDATES = ("/usr/share/java/postgresql.jar",)
LOOPBACK = "127.0.0.1"
LOOPBACK_NAMES = (LOOPBACK, "localhost")
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
LOG_CONFIG = Path(__file__).with_name("spark_log4j2.properties")
STANDALONE_PORT = 7077
# How long a standalone master may take to accept a connection: Spark itself retries for over a minute.
MASTER_CONNECT_TIMEOUT_S = 5.0


class SparkSetupError(RuntimeError):
    pass


def iceberg_runtime_jar() -> Path:
    spec = importlib.util.find_spec("snowpark_connect_deps_iceberg")
    if spec is None or not spec.submodule_search_locations:
        raise SparkSetupError(
            "the Iceberg runtime is missing: pip install snowpark-connect-deps-iceberg==1.0.2"
        )
    jar = Path(list(spec.submodule_search_locations)[0]) / "jars" / ICEBERG_JAR_NAME
    if not jar.exists():
        raise SparkSetupError(
            f"{jar} not found: pin snowpark-connect-deps-iceberg==1.0.2 (1.0.3's jar is broken)"
        )
    return jar


def postgres_jdbc_jar() -> Path | None:
    for candidate in (os.environ.get("RUNSTATE_JDBC_JAR"), *JDBC_JAR_CANDIDATES):
        if candidate and Path(candidate).exists():
            return Path(candidate)
    return None


def jdbc_url(pg_url: str) -> tuple[str, str | None, str | None]:
    """A libpq DSN (a URL or key=value pairs) -> (jdbc:postgresql://host:port/db[?sslmode=..], user, password)."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(pg_url.replace("+psycopg2", "", 1))
    host = str(params.get("host") or "localhost")
    if host.startswith("/"):
        raise SparkSetupError(
            f"Spark's JDBC driver reaches Postgres over TCP, not through the socket directory {host!r}: "
            "give the DSN a host name or address"
        )
    user = params.get("user")
    database = params.get("dbname") or user or "postgres"
    query = f"?sslmode={params['sslmode']}" if params.get("sslmode") else ""
    url = f"jdbc:postgresql://{host}:{params.get('port') or 5432}/{database}{query}"
    return url, user, params.get("password")


def default_driver_host(master: str) -> str | None:
    """Loopback when every executor runs on this machine (`local[...]`, a standalone master on loopback);
    otherwise None: Spark's own default (this host's name), which YARN and Kubernetes clients expect."""
    if master.startswith("local"):
        return LOOPBACK
    if master.startswith("spark://"):
        hosts = [urlsplit(f"spark://{part}").hostname for part in master[len("spark://") :].split(",")]
        if all(host in LOOPBACK_NAMES for host in hosts):
            return LOOPBACK
    return None


@dataclass(frozen=True)
class SparkSettings:
    """The Spark configuration of one deployment (or a test's, a benchmark's): the Spark domain's config."""

    master: str = Settings.spark_master
    pg_url: str | None = None
    catalog_kind: str = Settings.iceberg_catalog
    warehouse_dir: Path = field(default_factory=default_warehouse_dir)
    extra_conf: Mapping[str, str] = field(default_factory=dict)
    app_name: str = "runstate"
    driver_host: str | None = None  # None: default_driver_host(master)

    @classmethod
    def from_settings(cls, s: Settings) -> SparkSettings:
        """RUNSTATE_SPARK_MASTER, RUNSTATE_SPARK_CONF, RUNSTATE_SPARK_DRIVER_HOST, the catalog and warehouse."""
        return cls(
            master=s.spark_master,
            pg_url=s.pg_url,
            catalog_kind=s.iceberg_catalog,
            warehouse_dir=s.warehouse_dir,
            extra_conf=s.spark_conf,
            driver_host=s.spark_driver_host,
        )

    def catalog_conf(self) -> dict[str, str]:
        warehouse = self.warehouse_dir.resolve().as_uri()
        prefix = f"spark.sql.catalog.{CATALOG}"
        conf = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.warehouse": warehouse}
        if self.catalog_kind == "jdbc" and self.pg_url and postgres_jdbc_jar():
            url, user, password = jdbc_url(self.pg_url)
            conf[f"{prefix}.catalog-impl"] = "org.apache.iceberg.jdbc.JdbcCatalog"
            conf[f"{prefix}.uri"] = url
            conf[f"{prefix}.jdbc.schema-version"] = "V1"
            if user:
                conf[f"{prefix}.jdbc.user"] = user
            if password:
                conf[f"{prefix}.jdbc.password"] = password
        else:
            conf[f"{prefix}.type"] = "hadoop"
        return conf

    def conf(self) -> dict[str, str]:
        jars = [str(iceberg_runtime_jar())]
        jdbc = postgres_jdbc_jar()
        if jdbc:
            jars.append(str(jdbc))
        conf = {
            "spark.jars": ",".join(jars),
            "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
            **self.driver_address_conf(),
            "spark.driver.memory": "1g",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.sql.session.timeZone": "UTC",
            # Spark's own catalog is unused (every table is in `lake`); its default warehouse is a
            # spark-warehouse/ folder in whatever directory the command ran from.
            "spark.sql.warehouse.dir": str(Path(tempfile.gettempdir()) / "runstate-spark-warehouse"),
            # createDataFrame(pandas) sends Arrow batches to the JVM rather than a Row per row.
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            # SQL names tables, never files (``csv.`/etc/passwd` ``): runstate reads files through its own
            # code only, and `runstate sql` must read the lake's tables alone.
            "spark.sql.runSQLOnFiles": "false",
            **self.catalog_conf(),
        }
        conf.update(self.extra_conf)
        conf[DRIVER_JAVA_OPTIONS] = with_log_config(conf.get(DRIVER_JAVA_OPTIONS, ""))
        return conf

    def driver_address_conf(self) -> dict[str, str]:
        """Where the driver listens and what it tells executors; Spark's defaults when no host is known."""
        host = self.driver_host or default_driver_host(self.master)
        return {"spark.driver.host": host, "spark.driver.bindAddress": host} if host else {}

    @property
    def is_jdbc(self) -> bool:
        impl = self.catalog_conf().get(f"spark.sql.catalog.{CATALOG}.catalog-impl", "")
        return impl.endswith("JdbcCatalog")


def with_log_config(java_options: str) -> str:
    """The driver's Java options with runstate's log configuration, unless they name one already."""
    if "log4j2.configurationFile" in java_options:
        return java_options
    return f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()} {java_options}".strip()


def create_namespace(spark: SparkSession, namespace: str) -> None:
    """`CREATE NAMESPACE IF NOT EXISTS lake.<namespace>`, beside other processes doing the same: the JDBC
    catalog checks and inserts in two steps, so of two first creations at once the later one fails on the
    catalog's key (after the other committed); done again, its check sees the namespace."""
    statement = f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.{namespace}"
    try:
        spark.sql(statement)
    except Exception:  # PySpark's errors or py4j's: any failure but this race fails the second try too
        spark.sql(statement)


def spark_config(settings: SparkSettings) -> dict[str, str]:
    """The whole session configuration (master and app name included) as one flat dict.

    This is the one mapping from settings to Spark: dagster-pyspark's resource takes it as its
    `spark_config`, and `build_session` gives it to the builder the same way. The master is
    `settings.master` (RUNSTATE_SPARK_MASTER) whatever `extra_conf` says.
    """
    return {"spark.app.name": settings.app_name, **settings.conf(), "spark.master": settings.master}


def check_master_answers(master: str) -> None:
    """SparkSetupError at once when no master of a standalone URL (spark://h1:p1,h2:p2) accepts a
    connection; Spark would retry for over a minute, then fail with a traceback. Other masters: unchecked."""
    if not master.startswith("spark://"):
        return
    errors = []
    for part in master[len("spark://") :].split(","):
        address = urlsplit(f"spark://{part}")
        try:
            host, port = address.hostname or "", address.port or STANDALONE_PORT
            with socket.create_connection((host, port), timeout=MASTER_CONNECT_TIMEOUT_S):
                return
        except (OSError, ValueError) as error:
            errors.append(f"{part}: {error}")
    raise SparkSetupError(f"the Spark master {master} does not answer ({'; '.join(errors)})")


def use_this_python_for_tasks() -> None:
    """Python tasks (the dataset merges' blob readers) run on the driver's interpreter, so they see the
    same packages. PySpark reads PYSPARK_PYTHON (not `spark.pyspark.python`) when the context starts;
    an explicit setting, e.g. a cluster's, wins."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def build_session(settings: SparkSettings) -> SparkSession:
    """A session outside Dagster (CLI, tests, benchmarks), configured exactly as the resource's."""
    from pyspark.sql import SparkSession

    use_this_python_for_tasks()
    check_master_answers(settings.master)
    config = spark_config(settings)
    start_the_jvm_in_its_own_session(config)
    builder = SparkSession.builder
    for key, value in config.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def start_the_jvm_in_its_own_session(config: Mapping[str, str]) -> None:
    """The Spark context, its JVM out of the caller's process group, unless one runs already.

    A stop signal to the process group (`timeout`, a shell's job control) reached the JVM too, which
    then died under whatever it did and logged its own errors and stack traces on the command's stderr.
    Out of the group, the JVM is stopped by its caller: the signal cancels the Spark job in flight
    (runstate.spark_interrupts), and the JVM exits when its caller's end of its stdin closes, on any exit
    of the caller, SIGKILL included (PySpark's gateway server watches it). PySpark itself keeps the
    terminal's Ctrl-C from the JVM the same way, by ignoring SIGINT there."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._active_spark_context is not None:
        return
    conf = SparkConf().setAll(list(config.items()))
    SparkContext(conf=conf, gateway=launch_gateway(conf, popen_kwargs={"start_new_session": True}))
