"""The event store resource: configuration plus a factory for the core's Postgres or Snowflake store.

The backend comes from configuration (`RUNSTATE_EVENTSTORE`, default postgres). Snowflake is reached
through `SnowflakeConnection`, the connector's arguments as a small nested resource (secrets as
`dg.EnvVar`), the snowflake backend's `resource` in `runstate.backends`. Not dagster-snowflake's
SnowflakeResource: importing it took 2.2-2.4 s at every load of the code location, and its
get_connection() opens a connection per call where the store reuses a pool (20 `select 1`: 5.8 s
against 0.10 s; docs/ARCHITECTURE.md, "The configuration path").
Nothing connects until `get_store()` is first called.
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field, PrivateAttr, field_validator

from runstate import backends, wiring
from runstate.config import ARCHIVE_TARGETS
from runstate.defs.config_fields import config_fields, config_of, secret
from runstate.eventstore import EventStore
from runstate.eventstore.config import EventStoreConfig, SnowflakeConfig


class SnowflakeConnection(dg.ConfigurableResource):
    """Arguments of `snowflake.connector.connect()` for the event store: the fields of `SnowflakeConfig`,
    whose `connect_kwargs()` adds the options every runstate connection takes."""

    account: str = Field(description="Snowflake account identifier.")
    user: str | None = Field(default=SnowflakeConfig.user, description="User name.")
    password: str | None = Field(
        default=SnowflakeConfig.password, description="Password (pass it as an EnvVar)."
    )
    database: str | None = Field(
        default=SnowflakeConfig.database, description="Database holding the event store schema."
    )
    warehouse: str | None = SnowflakeConfig.warehouse
    role: str | None = SnowflakeConfig.role
    host: str | None = Field(
        default=SnowflakeConfig.host, description="Endpoint host, when not the account's default."
    )
    port: int | None = SnowflakeConfig.port
    protocol: str | None = Field(
        default=SnowflakeConfig.protocol, description="`https` (default) or `http` (a local endpoint)."
    )
    network_timeout: int | None = Field(
        default=SnowflakeConfig.network_timeout,
        description="Seconds before the connector gives up (default: for ever; 1 over http).",
    )

    @classmethod
    def of(cls, config: SnowflakeConfig) -> SnowflakeConnection:
        """The resource of `config`, its password as an EnvVar when SNOWFLAKE_PASSWORD is set (the snowflake
        backend's `resource` in runstate.backends)."""
        return cls(**{**config_fields(config), "password": secret("SNOWFLAKE_PASSWORD") or config.password})

    def config(self) -> SnowflakeConfig:
        return config_of(self, SnowflakeConfig)


class EventStoreResource(dg.ConfigurableResource):
    """The run state store (`runstate.eventstore`), opened lazily on the configured backend: the fields
    of `EventStoreConfig`, opened through `runstate.wiring` as the CLI opens it."""

    backend: str = Field(default=EventStoreConfig.backend, description="`postgres` or `snowflake`.")
    pg_url: str = Field(
        default=EventStoreConfig.pg_url,
        description="Postgres DSN (postgres backend); pass it as an EnvVar when it holds a password.",
    )
    pg_schema: str = Field(
        default=EventStoreConfig.pg_schema, description="Postgres schema holding the event tables."
    )
    snowflake: SnowflakeConnection | None = Field(
        default=None, description="Connection to Snowflake (snowflake backend, and the target of migrations)."
    )
    snowflake_schema: str = Field(
        default=EventStoreConfig.snowflake_schema, description="Snowflake schema holding the event tables."
    )
    snapshot_interval: int = Field(
        default=EventStoreConfig.snapshot_interval,
        description="Write a state snapshot every N events of a run.",
    )
    archive_to: str = Field(
        default=EventStoreConfig.archive_to,
        description="Where `archive` moves old runs: `postgres` (run_events_archive) or `lake` (dropped "
        "from Postgres once the run history in the lake has them; read back from there).",
    )
    lake_namespace: str = Field(
        default=EventStoreConfig.lake_namespace,
        description="The run history's namespace: runs archived to the lake are in lake.<namespace>.run_events.",
    )
    lake_warehouse: str | None = Field(
        default=EventStoreConfig.lake_warehouse,
        description="The Iceberg warehouse folder of the lake catalog (default: RUNSTATE_WAREHOUSE's default).",
    )
    ensure_schema: bool = Field(
        default=True, description="Apply pending migrations when the store is first opened."
    )

    _stores: dict = PrivateAttr(default_factory=dict)

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        backends.get(value)  # an UnknownBackend (a ValueError) lists the known ones
        return value

    @field_validator("archive_to")
    @classmethod
    def _known_archive_target(cls, value: str) -> str:
        if value not in ARCHIVE_TARGETS:
            raise ValueError(f"archive_to must be one of {', '.join(ARCHIVE_TARGETS)}, got {value!r}")
        return value

    def config(self) -> EventStoreConfig:
        # A backend with a connection of its own holds it as a nested resource of its name.
        connections = {entry.name: getattr(self, entry.name) for entry in backends.with_connections()}
        return config_of(
            self,
            EventStoreConfig,
            **{name: held.config() if held else None for name, held in connections.items()},
        )

    def get_store(self, backend: str | None = None) -> EventStore:
        """The store of `backend` (default: the configured one), built on first use and then reused."""
        backend = backend or self.backend
        if backend not in self._stores:
            store = wiring.event_store(self.config(), backend)
            if self.ensure_schema:
                store.ensure_schema()
            self._stores[backend] = store
        return self._stores[backend]

    def close(self) -> None:
        for store in self._stores.values():
            store.close()
        self._stores.clear()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.close()
