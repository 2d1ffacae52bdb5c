"""One frozen Settings object, read from the environment once.

Values come from the process environment first, then from the project's `.env` (the block that
`runstate services up` writes there, plus anything the user adds), then from the embedded defaults.
`.env` is Dagster's convention too: `dagster dev`, `dagster-webserver`, `dagster-daemon run` and
`dagster definitions validate` load it from the folder they start in (and there it wins over the
process environment).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

EVENTSTORE_BACKENDS = ("postgres", "snowflake")
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/runstate"


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


@dataclass(frozen=True)
class Settings:
    pg_url: str
    dagster_pg_url: str
    schema: str
    aws_endpoint_url: str | None
    aws_region: str
    wal_table: str
    blob_bucket: str
    blob_prefix: str
    eventstore: str
    snowflake: Mapping[str, str] = field(default_factory=dict)
    spark_master: str = "local[2]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    # The address executors reach the driver at; None: loopback for local and loopback masters, else Spark's.
    spark_driver_host: str | None = None
    iceberg_catalog: str = "jdbc"
    warehouse_dir: Path = Path(".runstate/warehouse")
    # WAL flush shards: each shard run is a process that loads the code location, so 2 suits a 2-core
    # machine; scale it with the cluster (docs/OPERATIONS.md).
    wal_flush_shards: int = 2
    # A flush run stays this long for new rows of its shard after its plan (the WAL's freshness lever).
    wal_flush_linger_s: float = 20.0
    maintenance_workers: int = 2

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = {**read_env_file(), **(environ if environ is not None else os.environ)}
        pg_url = env.get("RUNSTATE_PG_URL", DEFAULT_PG_URL)
        backend = env.get("RUNSTATE_EVENTSTORE", "postgres")
        if backend not in EVENTSTORE_BACKENDS:
            raise ValueError(f"RUNSTATE_EVENTSTORE must be one of {EVENTSTORE_BACKENDS}, got {backend!r}")
        spark_conf = json.loads(env.get("RUNSTATE_SPARK_CONF") or "{}")
        if not isinstance(spark_conf, dict):
            raise ValueError("RUNSTATE_SPARK_CONF must be a JSON object of Spark settings")
        return cls(
            pg_url=pg_url,
            dagster_pg_url=env.get("DAGSTER_PG_URL", dagster_url_for(pg_url)),
            schema=env.get("RUNSTATE_SCHEMA", "runstate"),
            aws_endpoint_url=env.get("RUNSTATE_AWS_ENDPOINT_URL") or None,
            aws_region=env.get("AWS_DEFAULT_REGION", "us-east-1"),
            wal_table=env.get("RUNSTATE_WAL_TABLE", "runstate_wal"),
            blob_bucket=env.get("RUNSTATE_BLOB_BUCKET", "runstate-blobs"),
            blob_prefix=env.get("RUNSTATE_BLOB_PREFIX", "datasets/"),
            eventstore=backend,
            snowflake={
                k[len("SNOWFLAKE_") :].lower(): v for k, v in env.items() if k.startswith("SNOWFLAKE_")
            },
            spark_master=env.get("RUNSTATE_SPARK_MASTER", "local[2]"),
            spark_conf={str(k): str(v) for k, v in spark_conf.items()},
            spark_driver_host=env.get("RUNSTATE_SPARK_DRIVER_HOST") or None,
            iceberg_catalog=env.get("RUNSTATE_ICEBERG_CATALOG", "jdbc"),
            warehouse_dir=Path(env.get("RUNSTATE_WAREHOUSE", str(state_dir() / "warehouse"))),
            wal_flush_shards=_positive_int(env, "RUNSTATE_WAL_FLUSH_SHARDS", 2),
            wal_flush_linger_s=_seconds(env, "RUNSTATE_WAL_FLUSH_LINGER_S", 20.0),
            maintenance_workers=_positive_int(env, "RUNSTATE_MAINTENANCE_WORKERS", 2),
        )


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name) or str(default)
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}")
    return int(raw)


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name) or str(default)
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise ValueError(f"{name} must be a number of seconds from 0 to 3600, got {raw!r}")
    return value


def dagster_url_for(pg_url: str) -> str:
    """Dagster's storage needs the psycopg2 SQLAlchemy scheme and its own database."""
    base, _, _ = pg_url.rpartition("/")
    return base.replace("postgresql://", "postgresql+psycopg2://", 1) + "/dagster"


@lru_cache(maxsize=1)
def settings() -> Settings:
    return Settings.from_env()
