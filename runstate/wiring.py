"""Every core object built from the Settings, in one place, without dagster.

The CLI and the Dagster resources (`runstate/defs/resources.py`) both build through these functions,
so a Snowflake argument, a schema rule or a client setting is written once. Nothing connects here:
each object opens its connections on first use. Which backend's builders serve a name is
`runstate.backends`' to say (its entries name postgres_datastore and snowflake_datastore).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from runstate.config import Settings, settings

# Imported where used: the CLI imports this module to build its verbs, and `runstate --help` must not
# pay for a database driver.
if TYPE_CHECKING:
    from runstate.datastore import PostgresDatastore, SnowflakeDatastore

# A wrong host or port should fail in seconds, not after the connector's default of two minutes.
SNOWFLAKE_LOGIN_TIMEOUT_S = 20
_SNOWFLAKE_KEYS = ("account", "user", "password", "database", "warehouse", "role", "host", "protocol")


def snowflake_schema(s: Settings | None = None) -> str:
    """SNOWFLAKE_SCHEMA, else RUNSTATE: the schema of the Snowflake event store and its migrations."""
    return ((s or settings()).snowflake.get("schema") or "RUNSTATE").upper()


def snowflake_connect_kwargs(values: Mapping[str, str]) -> dict[str, Any] | None:
    """snowflake.connector.connect() arguments from the SNOWFLAKE_* settings; None without an account."""
    if not values.get("account"):
        return None
    kwargs: dict[str, Any] = {key: values[key] for key in _SNOWFLAKE_KEYS if values.get(key)}
    if values.get("port"):
        kwargs["port"] = int(values["port"])
    # A server fault (HTTP 5xx) is retried by the connector until network_timeout (unset: for ever). Against
    # fakesnow (plain http) only its own bugs still answer 500 (services/fakesnow_errors.py): give up after
    # a second rather than never. Real Snowflake: unset.
    if values.get("network_timeout"):
        kwargs["network_timeout"] = int(values["network_timeout"])
    elif values.get("protocol") == "http":
        kwargs["network_timeout"] = 1
    kwargs["login_timeout"] = SNOWFLAKE_LOGIN_TIMEOUT_S
    # Out-of-band telemetry posts to Snowflake's own endpoint: it has no business running from here.
    kwargs["session_parameters"] = {"CLIENT_OUT_OF_BAND_TELEMETRY_ENABLED": False}
    return kwargs


def postgres_datastore(s: Settings | None = None, **options: Any) -> PostgresDatastore:
    """The Postgres datastore of RUNSTATE_PG_URL / RUNSTATE_SCHEMA (options: pool_size, ...)."""
    from runstate.datastore import PostgresDatastore

    s = s or settings()
    return PostgresDatastore(s.pg_url, schema=s.schema, **options)


def snowflake_datastore(s: Settings | None = None, **options: Any) -> SnowflakeDatastore | None:
    """The Snowflake datastore of the SNOWFLAKE_* settings; None when no account is configured."""
    from runstate.datastore import SnowflakeDatastore

    s = s or settings()
    kwargs = snowflake_connect_kwargs(s.snowflake)
    if kwargs is None:
        return None
    return SnowflakeDatastore(kwargs, schema=snowflake_schema(s), **options)


def aws_client(service: str, s: Settings | None = None) -> Any:
    """A boto3 client of `service` at RUNSTATE_AWS_ENDPOINT_URL (unset: AWS), credentials from the environment."""
    import os

    from runstate.wal.clients import aws_client as make_client

    s = s or settings()
    return make_client(
        service,
        endpoint_url=s.aws_endpoint_url,
        region=s.aws_region,
        access_key_id=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
    )


def require_schema(domain: str, backend: str = "postgres", s: Settings | None = None) -> None:
    """SchemaNotCurrent (a MigrationError: one `Error:` line in the CLI) unless `domain`'s tables are
    current; one query on a connection of its own. The CLI's verbs call it instead of migrating."""
    from runstate import backends, migrations

    entry = backends.get(backend)
    store = entry.build_datastore(s or settings())
    if store is None:
        raise migrations.MigrationError(f"backend {backend!r} needs {entry.needs}")
    try:
        migrations.require_current(store, domain, pooled=False)
    finally:
        store.close()


def event_store(s: Settings | None = None, backend: str | None = None, **options: Any) -> Any:
    """The run state store of RUNSTATE_EVENTSTORE (or `backend`) on its datastore, which it closes with
    itself; options: snapshot_interval, ..."""
    from runstate import backends
    from runstate.eventstore import EventStoreError

    s = s or settings()
    entry = backends.get(backend or s.eventstore)
    datastore = entry.build_datastore(s)
    if datastore is None:
        raise EventStoreError(f"event store backend {entry.name!r} needs {entry.needs}")
    return entry.open_event_store(datastore, **options)


def maintenance_store(s: Settings | None = None, **options: Any) -> Any:
    """The maintenance store (job queue, locks, cache, history) in RUNSTATE_SCHEMA."""
    from runstate.maintenance.store import MaintenanceStore

    s = s or settings()
    return MaintenanceStore(s.pg_url, schema=s.schema, **options)


def wal_table(s: Settings | None = None) -> Any:
    """The deployment's WAL table (one client: each costs a few tenths of a second)."""
    from runstate.wal import WalTable

    s = s or settings()
    return WalTable(aws_client("dynamodb", s), s.wal_table)


def blob_store(s: Settings | None = None) -> Any:
    """The deployment's blob bucket and prefix."""
    from runstate.wal import BlobStore

    s = s or settings()
    return BlobStore(aws_client("s3", s), s.blob_bucket, s.blob_prefix)
