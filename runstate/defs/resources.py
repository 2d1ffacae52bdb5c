"""Every resource of the code location, built from `runstate.config.settings()` in this one place.

The values that are not Dagster's (Snowflake's connection arguments, the schema rules) come from
`runstate.wiring`, which builds the same core objects for the CLI.

The resources themselves are configuration plus a factory: their fields hold explicit values and
never consult the environment. This module is the only route from the settings to them, so the
code location, the CLI's ticks and the demo configure the same resources. Each builder reads the
settings when called (not when imported), so a caller that changes the environment and clears
`settings` gets resources that follow it. The dataset tables have no resource of their own: their
merges use `wal` (where the blobs are) and `spark`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import dagster as dg

from runstate import wiring
from runstate.config import Settings, settings

# The domain packages (`runstate.defs.<domain>`) call these builders when they are imported, so the
# resource classes, which live inside those packages, are imported when a builder runs, not here.
if TYPE_CHECKING:
    from runstate.defs.eventstore.resources import EventStoreResource, SnowflakeConnection
    from runstate.defs.maintenance.resources import MaintenanceResource
    from runstate.defs.spark import SparkResource
    from runstate.defs.wal.resources import WalResource


def _secret(name: str) -> dg.EnvVar | None:
    """An EnvVar when the variable is set, so the secret never lands in run config; else None."""
    return dg.EnvVar(name) if os.environ.get(name) else None


def spark_resource(s: Settings | None = None) -> SparkResource:
    """dagster-pyspark's lazy session, configured from RUNSTATE_SPARK_MASTER / RUNSTATE_SPARK_CONF."""
    from runstate.defs.spark import SparkResource
    from runstate.spark import settings_from_runstate

    return SparkResource.from_settings(settings_from_runstate(s))


def snowflake_connection(s: Settings | None = None) -> SnowflakeConnection | None:
    """SnowflakeConnection from SNOWFLAKE_* settings; None when no account is configured."""
    from runstate.defs.eventstore.resources import SnowflakeConnection

    kwargs = wiring.snowflake_connect_kwargs((s or settings()).snowflake)
    if kwargs is None:
        return None
    fields = {key: value for key, value in kwargs.items() if key in SnowflakeConnection.model_fields}
    if password := _secret("SNOWFLAKE_PASSWORD"):
        fields["password"] = password
    return SnowflakeConnection(**fields)


def event_store_resource(s: Settings | None = None) -> EventStoreResource:
    from runstate.defs.eventstore.resources import EventStoreResource

    s = s or settings()
    return EventStoreResource(
        backend=s.eventstore,
        pg_url=s.pg_url,
        pg_schema=s.schema,
        snowflake=snowflake_connection(s),
        snowflake_schema=wiring.snowflake_schema(s),
    )


def wal_resource(s: Settings | None = None, **overrides: Any) -> WalResource:
    from runstate.defs.wal.resources import WalResource

    s = s or settings()
    config: dict[str, Any] = {
        "endpoint_url": s.aws_endpoint_url,
        "region": s.aws_region,
        "table": s.wal_table,
        "bucket": s.blob_bucket,
        "prefix": s.blob_prefix,
        "flush_shards": s.wal_flush_shards,
        "flush_linger_s": s.wal_flush_linger_s,
        "dataset_table_copy_on_write_max_mb": s.copy_on_write_max_mb,
        "aws_access_key_id": _secret("AWS_ACCESS_KEY_ID"),
        "aws_secret_access_key": _secret("AWS_SECRET_ACCESS_KEY"),
    }
    return WalResource(**{**config, **overrides})


def maintenance_resource(s: Settings | None = None, **overrides: Any) -> MaintenanceResource:
    from runstate.defs.maintenance.resources import MaintenanceResource

    s = s or settings()
    config = {
        "dsn": s.pg_url,
        "pg_schema": s.schema,
        "max_worker_runs": s.maintenance_workers,
        "apply_deletes_at": s.apply_deletes_at,
    }
    return MaintenanceResource(**{**config, **overrides})
