"""Every resource of the code location, built from `runstate.config.settings()` in this one place.

Each resource holds the fields of its domain's config (`EventStoreConfig`, `WalConfig`,
`MaintenanceConfig`), derived from it with their defaults (`config_resource`), and builds its core
objects from that config through `runstate.wiring`, as the CLI does. Here each builder parses the
settings into the domain's config (`from_settings`) and gives the resource that config's fields
(`config_fields`; the resource reads its config back with `config_of`, all three in
`runstate.defs.config_fields`).

The resources themselves are configuration plus a factory: their fields hold explicit values and
never consult the environment. This module is the only route from the settings to them, so the
code location, the CLI's ticks and the demo configure the same resources. Each builder reads the
settings when called (not when imported), so a caller that changes the environment and clears
`settings` gets resources that follow it. The dataset tables have no resource of their own: their
merges use `wal` (where the blobs are) and `spark`.

Secrets reach the resources as `dg.EnvVar`s whenever the process environment holds them, so the UI, the
GraphQL API and the run config show the variable's name, never its value: the AWS keys, the Snowflake
password and RUNSTATE_PG_URL when it holds a password (the event store's `pg_url`, the maintenance store's
`dsn` and the Spark session's `catalog_pg_url`, whose password `spark_config` then leaves out).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import dagster as dg

from runstate import backends
from runstate.config import Settings, settings
from runstate.defs.config_fields import config_fields, secret

# The domain packages (`runstate.defs.<domain>`) call these builders when they are imported, so the
# resource classes, which live inside those packages, are imported when a builder runs, not here.
if TYPE_CHECKING:
    from runstate.defs.eventstore.resources import EventStoreResource
    from runstate.defs.maintenance.resources import MaintenanceResource
    from runstate.defs.spark import SparkResource
    from runstate.defs.wal.resources import WalResource

PG_URL_VARIABLE = "RUNSTATE_PG_URL"


def dsn_password(dsn: str) -> str | None:
    """The password a libpq DSN (a URL or key=value pairs) holds; one that cannot be parsed counts as one."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        return conninfo_to_dict(dsn.replace("+psycopg2", "", 1)).get("password")
    except ProgrammingError:
        return dsn


def _pg_url(s: Settings) -> str:
    """The settings' Postgres DSN, as an EnvVar of RUNSTATE_PG_URL when it holds a password and the process
    environment gave it (Dagster's CLI loads `.env` into it). A DSN without a password stays visible."""
    if dsn_password(s.pg_url) and os.environ.get(PG_URL_VARIABLE) == s.pg_url:
        return dg.EnvVar(PG_URL_VARIABLE)
    return s.pg_url


def spark_resource(s: Settings | None = None) -> SparkResource:
    """dagster-pyspark's lazy session, configured from RUNSTATE_SPARK_MASTER / RUNSTATE_SPARK_CONF."""
    from runstate.defs.spark import SparkResource
    from runstate.spark import SparkSettings

    s = s or settings()
    pg_url = _pg_url(s)
    return SparkResource.from_settings(
        SparkSettings.from_settings(s), catalog_pg_url=pg_url if isinstance(pg_url, dg.EnvVar) else None
    )


def event_store_resource(s: Settings | None = None) -> EventStoreResource:
    from runstate.defs.eventstore.resources import EventStoreResource
    from runstate.eventstore.config import EventStoreConfig

    s = s or settings()
    config = EventStoreConfig.from_settings(s)
    return EventStoreResource(
        **{
            **config_fields(config),
            "pg_url": _pg_url(s),
            # Each backend's connection as its resource (runstate.backends: `resource`), secrets as EnvVars.
            **{
                entry.name: entry.connection_resource(getattr(config, entry.name))
                for entry in backends.with_connections()
            },
        }
    )


def wal_resource(s: Settings | None = None, **overrides: Any) -> WalResource:
    from runstate.defs.wal.resources import WalResource
    from runstate.wal.config import WalConfig

    secrets = {
        "aws_access_key_id": secret("AWS_ACCESS_KEY_ID"),
        "aws_secret_access_key": secret("AWS_SECRET_ACCESS_KEY"),
    }
    return WalResource(**{**config_fields(WalConfig.from_settings(s or settings())), **secrets, **overrides})


def maintenance_resource(s: Settings | None = None, **overrides: Any) -> MaintenanceResource:
    from runstate.defs.maintenance.resources import MaintenanceResource
    from runstate.maintenance.config import MaintenanceConfig

    s = s or settings()
    return MaintenanceResource(
        **{**config_fields(MaintenanceConfig.from_settings(s)), "dsn": _pg_url(s), **overrides}
    )
