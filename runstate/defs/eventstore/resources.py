"""The event store resource: configuration plus a factory for the core's Postgres or Snowflake store.

The backend comes from configuration (`RUNSTATE_EVENTSTORE`, default postgres). Snowflake is reached
through `SnowflakeConnection`, the connector's arguments as a small nested resource (secrets as
`dg.EnvVar`): dagster-snowflake's SnowflakeResource would import the Snowflake connector (about a
second) whenever the code location loads, and the store opens its own connections anyway.
Nothing connects until `get_store()` is first called.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr, field_validator

from runstate import backends
from runstate.config import DEFAULT_PG_URL
from runstate.eventstore import EventStore

_SNOWFLAKE_KEYS = ("account", "user", "password", "database", "warehouse", "role", "host", "protocol")


class SnowflakeConnection(dg.ConfigurableResource):
    """Arguments of `snowflake.connector.connect()` for the event store."""

    account: str = Field(description="Snowflake account identifier.")
    user: str = Field(description="User name.")
    password: str | None = Field(default=None, description="Password (pass it as an EnvVar).")
    database: str | None = Field(default=None, description="Database holding the event store schema.")
    warehouse: str | None = None
    role: str | None = None
    host: str | None = Field(default=None, description="Endpoint host, when not the account's default.")
    port: int | None = None
    protocol: str | None = Field(default=None, description="`https` (default) or `http` (a local endpoint).")
    network_timeout: int | None = Field(default=None, description="Seconds before the connector gives up.")

    def connect_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {key: getattr(self, key) for key in _SNOWFLAKE_KEYS if getattr(self, key)}
        if self.port:
            kwargs["port"] = self.port
        if self.network_timeout:
            kwargs["network_timeout"] = self.network_timeout
        # Out-of-band telemetry posts to Snowflake's own endpoint: it has no business running from here.
        kwargs["session_parameters"] = {"CLIENT_OUT_OF_BAND_TELEMETRY_ENABLED": False}
        return kwargs


class EventStoreResource(dg.ConfigurableResource):
    """The run state store (`runstate.eventstore`), opened lazily on the configured backend."""

    backend: str = Field(default="postgres", description="`postgres` or `snowflake`.")
    pg_url: str = Field(default=DEFAULT_PG_URL, description="Postgres DSN (postgres backend).")
    pg_schema: str = Field(default="runstate", description="Postgres schema holding the event tables.")
    snowflake: SnowflakeConnection | None = Field(
        default=None, description="Connection to Snowflake (snowflake backend, and the target of migrations)."
    )
    snowflake_schema: str = Field(
        default="RUNSTATE", description="Snowflake schema holding the event tables."
    )
    snapshot_interval: int = Field(default=100, description="Write a state snapshot every N events of a run.")
    ensure_schema: bool = Field(
        default=True, description="Apply pending migrations when the store is first opened."
    )

    _stores: dict = PrivateAttr(default_factory=dict)

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        backends.get(value)  # an UnknownBackend (a ValueError) lists the known ones
        return value

    def get_store(self, backend: str | None = None) -> EventStore:
        """The store of `backend` (default: the configured one), built on first use and then reused."""
        backend = backend or self.backend
        if backend not in self._stores:
            store = self._open(backend)
            if self.ensure_schema:
                store.ensure_schema()
            self._stores[backend] = store
        return self._stores[backend]

    def _open(self, backend: str) -> EventStore:
        """The store of `backend` (runstate.backends) on the connection this resource holds for it."""
        entry = backends.get(backend)
        # This resource's fields for each backend (issue 40 item 1 gives the resource one typed config).
        connections = {
            "postgres": (self.pg_url, self.pg_schema),
            "snowflake": (self.snowflake.connect_kwargs() if self.snowflake else None, self.snowflake_schema),
        }
        connection, schema = connections.get(backend, (None, None))
        if connection is None:
            needs = f": set {entry.needs}" if entry.needs else ""
            raise ValueError(f"event store backend {backend!r} needs the `{backend}` resource{needs}")
        return entry.open_event_store(
            entry.connect(connection, schema=schema), snapshot_interval=self.snapshot_interval
        )

    def close(self) -> None:
        for store in self._stores.values():
            store.close()
        self._stores.clear()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.close()
