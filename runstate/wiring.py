"""Every core object built from its domain's config, in one place, without dagster.

The path from configuration to objects: `Settings` (the environment, read once) is parsed into one
frozen config per domain (`EventStoreConfig`, `WalConfig`, `MaintenanceConfig`, `SparkSettings`,
`HistoryConfig`; `from_settings(s)` each), and these functions build the objects from those configs.
The CLI passes the configs of the Settings (or None: the same); the Dagster resources hold a config's
fields and pass their config, so a Snowflake argument, a schema rule or a client setting is written once.
Nothing connects here: each object opens its connections on first use. Which backend's builders serve a
name is `runstate.backends`' to say (its entries name postgres_datastore and snowflake_datastore).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runstate.config import settings

# Imported where used: the CLI imports this module to build its verbs, and `runstate --help` must not
# pay for a database driver.
if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from runstate.datastore import PostgresDatastore, SnowflakeDatastore
    from runstate.eventstore import EventStore
    from runstate.eventstore.config import EventStoreConfig
    from runstate.maintenance import MaintenanceStore
    from runstate.maintenance.config import MaintenanceConfig
    from runstate.spark import SparkSettings
    from runstate.wal import BlobStore, WalTable
    from runstate.wal.config import WalConfig


def event_store_config(config: EventStoreConfig | None = None) -> EventStoreConfig:
    """`config`, else the Settings' (RUNSTATE_EVENTSTORE, RUNSTATE_PG_URL, RUNSTATE_SCHEMA, SNOWFLAKE_*)."""
    from runstate.eventstore.config import EventStoreConfig

    return config or EventStoreConfig.from_settings(settings())


def postgres_datastore(config: EventStoreConfig, **options: Any) -> PostgresDatastore:
    """The Postgres datastore of the config's pg_url and pg_schema (options: pool_size, ...)."""
    from runstate.datastore import PostgresDatastore

    return PostgresDatastore(config.pg_url, schema=config.pg_schema, **options)


def snowflake_datastore(config: EventStoreConfig, **options: Any) -> SnowflakeDatastore | None:
    """The Snowflake datastore of the config's connection; None when it has none."""
    from runstate.datastore import SnowflakeDatastore

    if config.snowflake is None:
        return None
    return SnowflakeDatastore(config.snowflake.connect_kwargs(), schema=config.snowflake_schema, **options)


def require_schema(domain: str, backend: str = "postgres", config: EventStoreConfig | None = None) -> None:
    """SchemaNotCurrent (a MigrationError: one `Error:` line in the CLI) unless `domain`'s tables are
    current; one query on a connection of its own. The CLI's verbs call it instead of migrating."""
    from runstate import backends, migrations

    entry = backends.get(backend)
    store = entry.build_datastore(event_store_config(config))
    if store is None:
        raise migrations.MigrationError(f"backend {backend!r} needs {entry.needs}")
    try:
        migrations.require_current(store, domain, pooled=False)
    finally:
        store.close()


def event_store(
    config: EventStoreConfig | None = None, backend: str | None = None, **options: Any
) -> EventStore:
    """The run state store of the config's backend (or `backend`) on its datastore, which it closes with
    itself; options: those of the store (the snapshot interval, where archive() moves runs and the lake
    runs archived there are read back from are the config's)."""
    from runstate import backends
    from runstate.eventstore import EventStoreError

    config = event_store_config(config)
    entry = backends.get(backend or config.backend)
    datastore = entry.build_datastore(config)
    if datastore is None:
        raise EventStoreError(f"event store backend {entry.name!r} needs {entry.needs}")
    defaults = {
        "snapshot_interval": config.snapshot_interval,
        "archive_to": config.archive_to,
        "lake": lake_reader(config),
    }
    return entry.open_event_store(datastore, **{**defaults, **options})


def lake_reader(config: EventStoreConfig) -> Callable[[], Any]:
    """A factory of the reader of runs archived to the lake (pyiceberg on the JDBC catalog in the config's
    Postgres database, `lake.<lake_namespace>.run_events`); nothing is imported or opened until it is called."""
    from runstate.config import default_warehouse_dir
    from runstate.eventstore.lake_archive import lake_reader_factory

    warehouse = config.lake_warehouse or default_warehouse_dir()
    return lake_reader_factory(config.pg_url, warehouse, config.lake_namespace)


def maintenance_store(config: MaintenanceConfig | None = None) -> MaintenanceStore:
    """The maintenance store (job queue, locks, cache, history) of the config's dsn and pg_schema."""
    from runstate.maintenance.config import MaintenanceConfig
    from runstate.maintenance.store import MaintenanceStore

    config = config or MaintenanceConfig.from_settings(settings())
    return MaintenanceStore(config.dsn, schema=config.pg_schema, max_attempts=config.max_attempts)


def wal_config(config: WalConfig | None = None) -> WalConfig:
    """`config`, else the Settings' (RUNSTATE_AWS_ENDPOINT_URL, RUNSTATE_WAL_TABLE, RUNSTATE_BLOB_*, ...)."""
    from runstate.wal.config import WalConfig

    return config or WalConfig.from_settings(settings())


def aws_client(service: str, config: WalConfig | None = None) -> Any:
    """A boto3 client of `service` at the config's endpoint (None: AWS) and region; empty credentials
    use boto3's own chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY first)."""
    from runstate.wal.clients import aws_client as make_client

    config = wal_config(config)
    return make_client(
        service,
        endpoint_url=config.endpoint_url,
        region=config.region,
        access_key_id=config.aws_access_key_id,
        secret_access_key=config.aws_secret_access_key,
    )


def wal_table(config: WalConfig | None = None, dynamodb: Any = None) -> WalTable:
    """The WAL table, on `dynamodb` or a new client (each costs a few tenths of a second)."""
    from runstate.wal import WalTable

    config = wal_config(config)
    return WalTable(dynamodb or aws_client("dynamodb", config), config.table)


def blob_store(config: WalConfig | None = None, s3: Any = None) -> BlobStore:
    """The blob bucket and prefix, on `s3` or a new client."""
    from runstate.wal import BlobStore

    config = wal_config(config)
    return BlobStore(s3 or aws_client("s3", config), config.bucket, config.prefix)


def spark_session(config: SparkSettings | None = None) -> SparkSession:
    """A Spark session outside Dagster, configured as the `spark` resource's (RUNSTATE_SPARK_*)."""
    from runstate.spark import SparkSettings, build_session

    return build_session(config or SparkSettings.from_settings(settings()))
