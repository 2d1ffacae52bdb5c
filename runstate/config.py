"""One frozen Settings object, read from the environment once.

Values come from the process environment first, then from the project's `.env` (the user's own lines,
then the block that `runstate services up` writes there for the variables they leave unset), then from
the embedded defaults. `.env` is Dagster's convention too: `dagster dev`, `dagster-webserver`,
`dagster-daemon run` and `dagster definitions validate` load it from the folder they start in (and
there it wins over the process environment).

A value that cannot be used is a ConfigError naming the variable, never a stand-in: every knob has
bounds (a shard or a worker is a run process, so a huge count is as wrong as zero).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from runstate import backends, defaults
from runstate.datastore.names import InvalidSchemaName, check_schema_name
from runstate.env_values import (
    ConfigError,
    bounded_int,
    choice,
    endpoint_url,
    seconds,
    shown,
    spark_conf_from_json,
    spark_driver_host,
    spark_master,
)

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/runstate"
# Runs finished more than this many days ago move to the archive (the archive_events schedule, `runstate
# events archive`); here, not in runstate.eventstore, so that the CLI shows it without importing a driver.
DEFAULT_ARCHIVE_AFTER_DAYS = 90


def project_home() -> Path:
    """The folder that holds `.runstate/`: RUNSTATE_HOME, else the source checkout, else cwd."""
    if os.environ.get("RUNSTATE_HOME"):
        return Path(os.environ["RUNSTATE_HOME"]).resolve()
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "pyproject.toml").exists():
        return checkout
    return Path.cwd()


def state_dir() -> Path:
    return project_home() / ".runstate"


def default_warehouse_dir() -> Path:
    """RUNSTATE_WAREHOUSE's default: the Iceberg warehouse folder under `.runstate/`."""
    return state_dir() / "warehouse"


def env_file() -> Path:
    """The project's `.env`, where Dagster's CLI looks for it when started in the project folder."""
    return project_home() / ".env"


def read_env_file(path: Path | None = None) -> dict[str, str]:
    from dotenv import dotenv_values  # the parser Dagster's CLI uses, so both read the file alike

    path = path or env_file()
    if not path.exists():
        return {}
    return {key: value for key, value in dotenv_values(path).items() if value is not None}


def load_env_file_into_environ() -> None:
    """Make `.env` visible to child processes (dagster dev) without overriding the caller."""
    for key, value in read_env_file().items():
        os.environ.setdefault(key, value)


# The bounds of each numeric knob: below them nothing would run, above them the machine or the
# Dagster run queue would drown (a shard or a worker is a run process with its own code location).
WAL_FLUSH_SHARDS_MAX = 256
WAL_FLUSH_MODES = ("always-on", "on-demand")
MAINTENANCE_WORKERS_MAX = 64
APPLY_DELETES_AT_MAX = 10_000
COPY_ON_WRITE_MAX_MB_MAX = 1 << 20
DATASET_MERGE_INTERVAL_MAX_S = 3600
# Each Spark session is a JVM of about a core and a gigabyte: the `runstate_spark` pool's limit.
SPARK_SESSIONS_MAX = 64
LINGER_MAX_S = 3600.0
# A run is dead after this long without a heartbeat; it beats every 2 s, so at least three beats fit.
RUN_DEAD_AFTER_MIN_S, RUN_DEAD_AFTER_MAX_S = 6.0, 3600.0
ICEBERG_CATALOGS = ("jdbc", "hadoop")
# Where `archive` moves old runs' events: Postgres's run_events_archive, or (dropped from Postgres once the
# export has them) the run history in the lake, `lake.<RUNSTATE_HISTORY_NAMESPACE>.run_events`.
ARCHIVE_TARGETS = ("postgres", "lake")
# The run history's knobs (runstate.eventstore.lake): one Iceberg commit holds at most a batch (the
# exporter keeps a batch in memory), and the lag check reads up to its bound of events from the feed.
HISTORY_BATCH_EVENTS_MAX = 1_000_000
HISTORY_EXPORT_INTERVAL_MAX_S = 3600
HISTORY_MAX_LAG_EVENTS_MAX = 1_000_000
HISTORY_MAX_LAG_MINUTES_MAX = 1440
LAKE_NAMESPACE = re.compile(r"^[a-z_][a-z0-9_]{0,127}$")


@dataclass(frozen=True)
class Settings:
    """The deployment's settings. A field's default is its variable's default, written here once: `from_env`
    and the domains' configs (`runstate.wiring` lists them) read it from the class."""

    # Derived from other values when unset: no default of their own.
    dagster_pg_url: str
    warehouse_dir: Path
    pg_url: str = DEFAULT_PG_URL
    schema: str = defaults.SCHEMA
    aws_endpoint_url: str | None = None
    aws_region: str = defaults.AWS_REGION
    wal_table: str = "runstate_wal"
    blob_bucket: str = "runstate-blobs"
    blob_prefix: str = "datasets/"
    eventstore: str = "postgres"
    archive_to: str = "postgres"
    # Each backend's own variables by its name (runstate.backends: `env_prefix`), the prefix cut and the
    # rest lower-cased: {"snowflake": {"account": ..., "user": ...}} from SNOWFLAKE_ACCOUNT, SNOWFLAKE_USER.
    backend_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    spark_master: str = "local[2]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    # The address executors reach the driver at; None: loopback for local and loopback masters, else Spark's.
    spark_driver_host: str | None = None
    iceberg_catalog: str = "jdbc"
    # WAL flush shards: each shard run is a process that loads the code location, so 2 suits a 2-core
    # machine; scale it with the cluster (docs/OPERATIONS.md).
    wal_flush_shards: int = 2
    # A flush run stays this long for new rows of its shard after its plan (the WAL's freshness lever).
    wal_flush_linger_s: float = 20.0
    # always-on: each flush shard has one live run that polls it and hands over to its successor;
    # on-demand: a run per shard with work, lingering wal_flush_linger_s (docs/OPERATIONS.md).
    wal_flush_mode: str = "always-on"
    # An always-on run's age before it hands its shard to a successor (each hand-over starts a run).
    wal_flush_run_budget_s: float = 240.0
    maintenance_workers: int = 2
    # Delete files a dataset table's merges may leave before a job applies them (0: the orchestrator's).
    apply_deletes_at: int = 8
    # Dataset tables merge copy-on-write up to this many MB, merge-on-read above (0: always on read).
    copy_on_write_max_mb: int = 16
    # How often dataset_tables_sensor looks for flushed datasets to merge into their Iceberg tables.
    dataset_merge_interval_s: int = 60
    # At most this many Spark sessions at once across all runs: the Dagster pool `runstate_spark`'s limit.
    spark_sessions: int = 2
    # The run history in the lake: its namespace (`lake.<namespace>.run_events` and `.runs`; unset, the
    # store's schema lower-cased, so two stores in one database never share a table), the most
    # events one Iceberg commit (and one read of a runs merge) takes, how often run_history_sensor looks
    # at the feed, and the lag (events, minutes) beyond which the run_history_lag check fails.
    history_namespace: str = defaults.SCHEMA
    history_batch_events: int = 100_000
    history_export_interval_s: int = 60
    history_max_lag_events: int = 10_000
    history_max_lag_minutes: int = 10
    # A run in progress whose heartbeat is older than this is dead (runstate.defs.runs.liveness).
    run_dead_after_s: float = 20.0

    @property
    def snowflake(self) -> Mapping[str, str]:
        """The SNOWFLAKE_* variables (`backend_env["snowflake"]`)."""
        return self.backend_env.get("snowflake", {})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings, or a ConfigError naming the first variable whose value cannot be used."""
        env = {**read_env_file(), **(environ if environ is not None else os.environ)}
        pg_url = env.get("RUNSTATE_PG_URL", cls.pg_url)
        schema = _schema(env, cls.schema)
        return cls(
            pg_url=pg_url,
            dagster_pg_url=env.get("DAGSTER_PG_URL", dagster_url_for(pg_url)),
            schema=schema,
            aws_endpoint_url=endpoint_url(env, "RUNSTATE_AWS_ENDPOINT_URL"),
            aws_region=env.get("AWS_DEFAULT_REGION", cls.aws_region),
            wal_table=env.get("RUNSTATE_WAL_TABLE", cls.wal_table),
            blob_bucket=env.get("RUNSTATE_BLOB_BUCKET", cls.blob_bucket),
            blob_prefix=env.get("RUNSTATE_BLOB_PREFIX", cls.blob_prefix),
            eventstore=choice(env, "RUNSTATE_EVENTSTORE", backends.names(), cls.eventstore),
            archive_to=_archive_to(env, cls.archive_to, cls.iceberg_catalog),
            backend_env=_backend_env(env),
            spark_master=spark_master(env, cls.spark_master),
            spark_conf=spark_conf_from_json(env.get("RUNSTATE_SPARK_CONF") or "{}"),
            spark_driver_host=spark_driver_host(env),
            iceberg_catalog=choice(env, "RUNSTATE_ICEBERG_CATALOG", ICEBERG_CATALOGS, cls.iceberg_catalog),
            warehouse_dir=Path(env.get("RUNSTATE_WAREHOUSE", str(default_warehouse_dir()))),
            wal_flush_shards=bounded_int(
                env, "RUNSTATE_WAL_FLUSH_SHARDS", cls.wal_flush_shards, WAL_FLUSH_SHARDS_MAX
            ),
            wal_flush_linger_s=seconds(
                env, "RUNSTATE_WAL_FLUSH_LINGER_S", cls.wal_flush_linger_s, LINGER_MAX_S
            ),
            wal_flush_mode=choice(env, "RUNSTATE_WAL_FLUSH_MODE", WAL_FLUSH_MODES, cls.wal_flush_mode),
            wal_flush_run_budget_s=seconds(
                env, "RUNSTATE_WAL_FLUSH_RUN_BUDGET_S", cls.wal_flush_run_budget_s, LINGER_MAX_S, minimum=10
            ),
            maintenance_workers=bounded_int(
                env, "RUNSTATE_MAINTENANCE_WORKERS", cls.maintenance_workers, MAINTENANCE_WORKERS_MAX
            ),
            apply_deletes_at=bounded_int(
                env, "RUNSTATE_APPLY_DELETES_AT", cls.apply_deletes_at, APPLY_DELETES_AT_MAX, minimum=0
            ),
            copy_on_write_max_mb=bounded_int(
                env,
                "RUNSTATE_COPY_ON_WRITE_MAX_MB",
                cls.copy_on_write_max_mb,
                COPY_ON_WRITE_MAX_MB_MAX,
                minimum=0,
            ),
            dataset_merge_interval_s=bounded_int(
                env,
                "RUNSTATE_DATASET_MERGE_INTERVAL_S",
                cls.dataset_merge_interval_s,
                DATASET_MERGE_INTERVAL_MAX_S,
                minimum=5,
            ),
            spark_sessions=bounded_int(
                env, "RUNSTATE_SPARK_SESSIONS", cls.spark_sessions, SPARK_SESSIONS_MAX
            ),
            history_namespace=_history_namespace(env, schema),
            history_batch_events=bounded_int(
                env, "RUNSTATE_HISTORY_BATCH_EVENTS", cls.history_batch_events, HISTORY_BATCH_EVENTS_MAX
            ),
            history_export_interval_s=bounded_int(
                env,
                "RUNSTATE_HISTORY_EXPORT_INTERVAL_S",
                cls.history_export_interval_s,
                HISTORY_EXPORT_INTERVAL_MAX_S,
                minimum=5,
            ),
            history_max_lag_events=bounded_int(
                env, "RUNSTATE_HISTORY_MAX_LAG_EVENTS", cls.history_max_lag_events, HISTORY_MAX_LAG_EVENTS_MAX
            ),
            history_max_lag_minutes=bounded_int(
                env,
                "RUNSTATE_HISTORY_MAX_LAG_MINUTES",
                cls.history_max_lag_minutes,
                HISTORY_MAX_LAG_MINUTES_MAX,
            ),
            run_dead_after_s=seconds(
                env,
                "RUNSTATE_RUN_DEAD_AFTER_S",
                cls.run_dead_after_s,
                RUN_DEAD_AFTER_MAX_S,
                minimum=RUN_DEAD_AFTER_MIN_S,
            ),
        )


def _backend_env(env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    prefixes = {backend.name: backend.env_prefix for backend in backends.all_backends() if backend.env_prefix}
    return {
        name: {key[len(prefix) :].lower(): value for key, value in env.items() if key.startswith(prefix)}
        for name, prefix in prefixes.items()
    }


def _archive_to(env: Mapping[str, str], default: str, default_catalog: str) -> str:
    raw = choice(env, "RUNSTATE_ARCHIVE_TO", ARCHIVE_TARGETS, default)
    # Archived runs are read back without a JVM (pyiceberg), which knows only the JDBC catalog's tables.
    if raw == "lake" and (env.get("RUNSTATE_ICEBERG_CATALOG") or default_catalog) != "jdbc":
        raise ConfigError(
            "RUNSTATE_ARCHIVE_TO=lake needs RUNSTATE_ICEBERG_CATALOG=jdbc (pyiceberg reads it back)"
        )
    return raw


def _schema(env: Mapping[str, str], default: str) -> str:
    try:
        return check_schema_name(env.get("RUNSTATE_SCHEMA", default))
    except InvalidSchemaName as error:
        raise ConfigError(f"RUNSTATE_SCHEMA: {error}") from None


def _history_namespace(env: Mapping[str, str], schema: str) -> str:
    # Unset, the run history follows the store's schema (lower-cased): a table of the lake belongs to
    # one store.
    raw = env.get("RUNSTATE_HISTORY_NAMESPACE") or schema.lower()
    if not LAKE_NAMESPACE.match(raw):
        raise ConfigError(
            f"RUNSTATE_HISTORY_NAMESPACE must be a lower-case identifier ([a-z_][a-z0-9_]*), got {shown(raw)}"
        )
    return raw


def dagster_url_for(pg_url: str) -> str:
    """Dagster's storage needs the psycopg2 SQLAlchemy scheme and its own database."""
    base, _, _ = pg_url.rpartition("/")
    return base.replace("postgresql://", "postgresql+psycopg2://", 1) + "/dagster"


@lru_cache(maxsize=1)
def settings() -> Settings:
    return Settings.from_env()
