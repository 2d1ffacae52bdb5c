"""The event store resource: configuration plus a factory for the core's Postgres or Snowflake store.

The backend comes from configuration (`RUNSTATE_EVENTSTORE`, default postgres). Snowflake is reached
through dagster-snowflake's `SnowflakeResource` (a nested resource), so the same connection settings,
secrets (`dg.EnvVar`) and fakesnow's `additional_snowflake_connection_args` apply as everywhere else.
Nothing connects until `get_store()` is first called.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import dagster as dg
from dagster_snowflake import SnowflakeResource
from pydantic import Field, PrivateAttr, field_validator

from runstate.config import EVENTSTORE_BACKENDS, Settings, settings

# Settings keys that SnowflakeResource takes as fields; the rest (host, port, protocol, ...) are connector args.
_SNOWFLAKE_FIELDS = ("account", "user", "database", "role", "warehouse")
_SNOWFLAKE_CONNECTOR_ARGS = ("host", "port", "protocol")


class EventStoreResource(dg.ConfigurableResource):
    """The run state store (`runstate.eventstore`), opened lazily on the configured backend."""

    backend: str = Field(default="postgres", description="`postgres` or `snowflake`.")
    pg_url: str = Field(
        default="postgresql://postgres@127.0.0.1:5432/runstate", description="Postgres DSN (postgres backend)."
    )
    pg_schema: str = Field(default="runstate", description="Postgres schema holding the event tables.")
    snowflake: Optional[SnowflakeResource] = Field(
        default=None, description="Connection to Snowflake (snowflake backend, and the target of migrations)."
    )
    snowflake_schema: str = Field(default="RUNSTATE", description="Snowflake schema holding the event tables.")
    snapshot_interval: int = Field(default=100, description="Write a state snapshot every N events of a run.")
    ensure_schema: bool = Field(default=True, description="Apply pending migrations when the store is first opened.")

    _stores: dict = PrivateAttr(default_factory=dict)
    _snowflake_connections: list = PrivateAttr(default_factory=list)

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value not in EVENTSTORE_BACKENDS:
            raise ValueError(f"event store backend must be one of {EVENTSTORE_BACKENDS}, got {value!r}")
        return value

    def get_store(self, backend: str | None = None) -> Any:
        """The store of `backend` (default: the configured one), built on first use and then reused."""
        backend = backend or self.backend
        if backend not in self._stores:
            store = self._open(backend)
            if self.ensure_schema:
                store.ensure_schema()
            self._stores[backend] = store
        return self._stores[backend]

    def _open(self, backend: str) -> Any:
        if backend == "postgres":
            from runstate.eventstore import PostgresEventStore

            return PostgresEventStore(self.pg_url, schema=self.pg_schema, snapshot_interval=self.snapshot_interval)
        if backend == "snowflake":
            from runstate.eventstore import SnowflakeEventStore

            if self.snowflake is None:
                raise ValueError(
                    "event store backend 'snowflake' needs the `snowflake` resource (set SNOWFLAKE_ACCOUNT, ...)"
                )
            return SnowflakeEventStore(
                self._snowflake_connection,
                schema=self.snowflake_schema,
                snapshot_interval=self.snapshot_interval,
            )
        raise ValueError(f"event store backend must be one of {EVENTSTORE_BACKENDS}, got {backend!r}")

    def _snowflake_connection(self) -> Any:
        """A new connector connection through SnowflakeResource; released when the resource is torn down."""
        opened = self.snowflake.get_connection()
        self._snowflake_connections.append(opened)
        return opened.__enter__()

    def close(self) -> None:
        for store in self._stores.values():
            store.close()
        self._stores.clear()
        while self._snowflake_connections:
            opened = self._snowflake_connections.pop()
            try:
                opened.__exit__(None, None, None)
            except Exception as exc:  # the store may have closed it already (e.g. after an error)
                dg.get_dagster_logger().debug(f"snowflake connection already closed: {exc}")

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.close()


def snowflake_resource_from_settings(s: Settings | None = None) -> SnowflakeResource | None:
    """SnowflakeResource from SNOWFLAKE_* settings; None when no account is configured."""
    s = s or settings()
    values = dict(s.snowflake)
    if not values.get("account"):
        return None
    fields: dict[str, Any] = {key: values[key] for key in _SNOWFLAKE_FIELDS if values.get(key)}
    # The secret stays an EnvVar when it is in the environment, so it never lands in the run config.
    fields["password"] = dg.EnvVar("SNOWFLAKE_PASSWORD") if os.environ.get("SNOWFLAKE_PASSWORD") else values.get(
        "password"
    )
    connector_args: dict[str, Any] = {key: values[key] for key in _SNOWFLAKE_CONNECTOR_ARGS if values.get(key)}
    if "port" in connector_args:
        connector_args["port"] = int(connector_args["port"])
    # fakesnow answers a failed statement with HTTP 500, which the connector retries until network_timeout
    # (unset: for ever); its own server fixture disables retries the same way. Real Snowflake: unset.
    if values.get("network_timeout"):
        fields["network_timeout"] = int(values["network_timeout"])
    elif connector_args.get("protocol") == "http":
        fields["network_timeout"] = 1
    # Out-of-band telemetry posts to Snowflake's own endpoint: it has no business running from here.
    connector_args["session_parameters"] = {"CLIENT_OUT_OF_BAND_TELEMETRY_ENABLED": False}
    return SnowflakeResource(additional_snowflake_connection_args=connector_args, **fields)


def event_store_resource(s: Settings | None = None) -> EventStoreResource:
    """The resource as configured by `runstate.config.settings()`."""
    s = s or settings()
    snowflake = snowflake_resource_from_settings(s)
    return EventStoreResource(
        backend=s.eventstore,
        pg_url=s.pg_url,
        pg_schema=s.schema,
        snowflake=snowflake,
        snowflake_schema=(s.snowflake.get("schema") or "RUNSTATE").upper(),
    )
