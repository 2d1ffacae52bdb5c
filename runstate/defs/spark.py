"""The `spark` resource every domain shares: dagster-pyspark's LazyPySparkResource.

The session is built on first use of `.spark_session` (a run that never touches Spark never starts
a JVM). Its `spark_config` comes from `runstate.spark.spark_config`, the one mapping from settings
to Spark, so the resource, the CLI, the tests and the benchmarks configure the same session. The one
secret of that mapping, the JDBC catalog's Postgres password, is left out of `spark_config` (which the UI
and the run config show) when the DSN comes from the environment: `catalog_pg_url` holds it as an EnvVar,
and the password joins the session's config only when the session is built.

How many sessions are alive at once is the Dagster pool `runstate_spark` (`SPARK_POOL`): an op or asset
that uses this resource is declared `pool=SPARK_POOL` and its compute function is wrapped in
`ends_spark_session`. Dagster takes the pool slot before the step starts, the JVM starts only when the
step first asks for the session, and `ends_spark_session` stops that JVM before the step ends and Dagster
frees the slot: a slot is never free while its JVM lives (without it the JVM would live until the run's
process exits, beside the next slot holder's).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from dagster_pyspark.resources import spark_session_from_config
from pydantic import Field, PrivateAttr

from runstate.spark import CATALOG, SparkSettings, jdbc_url, spark_config, use_this_python_for_tasks

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ComputeFn = TypeVar("ComputeFn", bound=Callable[..., Any])
# How long the JVM may take to exit once its session is stopped and its stdin closed.
JVM_EXIT_TIMEOUT_S = 60
log = logging.getLogger(__name__)

SETTINGS_FIELDS = tuple(field.name for field in dataclasses.fields(SparkSettings))
CATALOG_PASSWORD = f"spark.sql.catalog.{CATALOG}.jdbc.password"
CATALOG_IMPL = f"spark.sql.catalog.{CATALOG}.catalog-impl"


class SparkResource(LazyPySparkResource):
    """A lazily built SparkSession with the Iceberg runtime and the `lake` catalog.

    `SparkResource(spark_config={...})` takes a ready configuration; `SparkResource(master=...,
    pg_url=..., warehouse_dir=...)` is shorthand for `from_settings(SparkSettings(...))`.
    """

    catalog_pg_url: str | None = Field(
        default=None,
        description="The Postgres DSN of the lake's JDBC catalog, as an EnvVar (RUNSTATE_PG_URL) when it holds "
        "a password: the password is added to the session's config when the session is built, and "
        "spark_config does not hold it.",
    )
    # True when this resource launched the JVM (a run worker); False when it joined one that was already
    # running in the process (a test's shared session, the demo's), which it must leave alone.
    _owns_jvm: bool = PrivateAttr(default=False)

    def __init__(self, **fields: Any) -> None:
        shorthand = {name: fields.pop(name) for name in SETTINGS_FIELDS if name in fields}
        if shorthand:
            if "warehouse_dir" in shorthand:
                shorthand["warehouse_dir"] = Path(shorthand["warehouse_dir"])
            fields["spark_config"] = spark_config(SparkSettings(**shorthand))
        super().__init__(**fields)

    @classmethod
    def from_settings(cls, settings: SparkSettings, *, catalog_pg_url: str | None = None) -> SparkResource:
        """The resource of `settings`; given `catalog_pg_url` (settings.pg_url as a `dg.EnvVar`), the catalog's
        password is left out of `spark_config` and read from the variable when the session is built."""
        config = spark_config(settings)
        if catalog_pg_url is None or not settings.pg_url:
            return cls(spark_config=config)
        # Only the password the DSN gave: one that RUNSTATE_SPARK_CONF sets explicitly is the user's own.
        if config.get(CATALOG_PASSWORD) == jdbc_url(settings.pg_url)[2]:
            config.pop(CATALOG_PASSWORD, None)
        return cls(spark_config=config, catalog_pg_url=catalog_pg_url)

    def session_config(self) -> dict[str, Any]:
        """`spark_config` plus the JDBC catalog's password from `catalog_pg_url`: what the session is built from."""
        config = dict(self.spark_config)
        dsn = self.catalog_pg_url
        # Outside a run (the CLI's own use) the field still holds the EnvVar, not its value.
        if isinstance(dsn, dg.EnvVar):
            dsn = dsn.get_value()
        if dsn and CATALOG_PASSWORD not in config and config.get(CATALOG_IMPL, "").endswith("JdbcCatalog"):
            password = jdbc_url(dsn)[2]
            if password:
                config[CATALOG_PASSWORD] = password
        return config

    def _init_session(self) -> None:
        use_this_python_for_tasks()
        if self._spark_session is None:
            from pyspark import SparkContext

            self._owns_jvm = SparkContext._gateway is None
            self._spark_session = spark_session_from_config(self.session_config())

    def get_session(self) -> SparkSession:
        """The session (built on first call); the name the domains' ops use."""
        return self.spark_session

    def end_session(self) -> None:
        """Stop the session and the JVM this resource launched, and wait for the JVM to exit.

        A session it did not launch is left running. The next `get_session` builds a new one."""
        session, self._spark_session = self._spark_session, None
        if session is None or not self._owns_jvm:
            self._spark_session = session
            return
        self._owns_jvm = False
        stop_session_and_jvm(session)


def stop_session_and_jvm(session: SparkSession) -> None:
    """`session.stop()` ends the Spark application, but PySpark keeps its JVM (the py4j gateway) until the
    Python process exits; the JVM exits when its stdin closes, so close it and wait (PySpark's own tests
    reset `_gateway` and `_jvm` the same way, so the next session launches a new JVM)."""
    from pyspark import SparkContext

    session.stop()
    with SparkContext._lock:
        gateway, SparkContext._gateway, SparkContext._jvm = SparkContext._gateway, None, None
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    gateway.shutdown()
    if process is not None:
        process.stdin.close()
        try:
            process.wait(timeout=JVM_EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # it must not outlive the pool slot
            log.warning("the Spark JVM (pid %s) did not exit after its stdin closed; killing it", process.pid)
            process.kill()
            process.wait()


def ends_spark_session(compute_fn: ComputeFn) -> ComputeFn:
    """Wrap the compute function of a `pool=SPARK_POOL` op or asset (under its decorator) so the JVM its
    `SparkResource` argument launched is gone before the step ends, whatever the step's outcome."""

    @functools.wraps(compute_fn)
    def compute(*args: Any, **kwargs: Any) -> Any:
        try:
            return compute_fn(*args, **kwargs)
        finally:
            for value in kwargs.values():
                if isinstance(value, SparkResource):
                    value.end_session()

    compute.ends_spark_session = True  # type: ignore[attr-defined]  # what the definitions test looks for
    return compute  # type: ignore[return-value]
