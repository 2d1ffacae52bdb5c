"""Every core object built from the Settings, in one place, without dagster.

The CLI and the Dagster resources (`runstate/defs/resources.py`) both build through these functions,
so a Snowflake argument, a schema rule or a client setting is written once. Nothing connects here:
each object opens its connections on first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runstate.config import Settings, settings
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
    # fakesnow answers a failed statement with HTTP 500, which the connector retries until network_timeout
    # (unset: for ever); its own server fixture disables retries the same way. Real Snowflake: unset.
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
    s = s or settings()
    return PostgresDatastore(s.pg_url, schema=s.schema, **options)


def snowflake_datastore(s: Settings | None = None, **options: Any) -> SnowflakeDatastore | None:
    """The Snowflake datastore of the SNOWFLAKE_* settings; None when no account is configured."""
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
