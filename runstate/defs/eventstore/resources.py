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
from runstate.defs.config_fields import config_fields, config_of, config_resource, secret
from runstate.eventstore import EventStore
from runstate.eventstore.config import EventStoreConfig, SnowflakeConfig


class SnowflakeConnection(config_resource(SnowflakeConfig)):
    """Arguments of `snowflake.connector.connect()` for the event store: the fields of `SnowflakeConfig`,
    whose `connect_kwargs()` adds the options every runstate connection takes."""

    @classmethod
    def of(cls, config: SnowflakeConfig) -> SnowflakeConnection:
        """The resource of `config`, its password as an EnvVar when SNOWFLAKE_PASSWORD is set (the snowflake
        backend's `resource` in runstate.backends)."""
        return cls(**{**config_fields(config), "password": secret("SNOWFLAKE_PASSWORD") or config.password})

    def config(self) -> SnowflakeConfig:
        return config_of(self, SnowflakeConfig)


# `snowflake` holds the connection as its resource (the backend's `resource` in runstate.backends), not as
# a SnowflakeConfig: a nested resource, whose fields the launchpad shows and whose password may be an EnvVar.
class EventStoreResource(config_resource(EventStoreConfig, nested={"snowflake": SnowflakeConnection | None})):
    """The run state store (`runstate.eventstore`), opened lazily on the configured backend: the fields
    of `EventStoreConfig`, opened through `runstate.wiring` as the CLI opens it."""

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
