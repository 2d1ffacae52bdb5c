"""The storage backends, by name: the one place that knows which code serves "postgres" or "snowflake".

Each entry names, as `module:attribute` strings imported on first use (so that reading the registry, as
`config` does to check RUNSTATE_EVENTSTORE, imports no database driver), the parts of one backend:

- `datastore`: `(config, **options) -> datastore | None`, the backend's connection owner built from the
  event store's config (`runstate.eventstore.config.EventStoreConfig`: the CLI's from the Settings, the
  Dagster resource's from its fields); None when the config has no connection for the backend (`needs`
  then says what is missing);
- `event_store`: `(datastore, **options) -> EventStore`, the run state store on that datastore, which
  closes the datastore with itself (`runstate.eventstore.store.EventStore` holding the backend's
  statements and transactions);
- `migrations`: the module applying the backend's `sql/<backend>/<domain>/NNN_*.sql` files, with
  `upgrade(datastore, domain, migrations, *, session_settings, lock_timeout_s)` and
  `applied(datastore, domain, migrations, *, pooled)`; None for a backend that keeps no schema;
- `connection` (a backend whose connection needs values of its own, as Snowflake's account and
  password): `(settings) -> config | None`, its connection's config parsed from the Settings (None when
  they configure none), which `EventStoreConfig` holds in its field of the backend's name; `env_prefix`
  names its variables (SNOWFLAKE_), which the Settings keep for it in `backend_env[name]`;
- `resource`: the Dagster resource class holding that config's fields (for the launchpad and the UI),
  with `of(config)` (secrets as `dg.EnvVar`) and `config()`; `EventStoreResource` holds it in its field of
  the backend's name. A backend with `connection` has `resource`, and neither otherwise.

A datastore knows its backend's name (`datastore.backend`), so code holding one (the migrations, say)
finds its entry with `get(datastore.backend)`. Adding a backend is its module, its `sql/<backend>/`
folder and one `register(...)`; one with a connection of its own also declares the field of its name in
`EventStoreConfig` and `EventStoreResource` (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any


class UnknownBackend(ValueError):
    """A backend name with no entry; the message lists the known ones."""


@dataclass(frozen=True)
class Backend:
    name: str
    datastore: str
    event_store: str
    migrations: str | None
    needs: str = ""
    connection: str | None = None
    resource: str | None = None
    env_prefix: str | None = None

    def __post_init__(self) -> None:
        if (self.connection is None) != (self.resource is None):
            raise ValueError(f"backend {self.name!r}: a connection of its own needs a resource, and one only")

    def build_datastore(self, config: Any, **options: Any) -> Any:
        """The backend's datastore from the event store's config, or None when it has no connection for it."""
        return _resolve(self.datastore)(config, **options)

    def open_event_store(self, datastore: Any, **options: Any) -> Any:
        """The run state store on `datastore`; closing the store closes the datastore."""
        return _resolve(self.event_store)(datastore, **options)

    def migrations_module(self) -> ModuleType | None:
        return importlib.import_module(self.migrations) if self.migrations else None

    def connection_config(self, settings: Any) -> Any:
        """Its connection's config from the Settings; None when they configure none (or it has none)."""
        return _resolve(self.connection)(settings) if self.connection else None

    def connection_resource(self, config: Any) -> Any:
        """The Dagster resource holding `config` (its secrets as EnvVars); None for no config."""
        if self.resource is None or config is None:
            return None
        return _resolve(self.resource).of(config)


_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> None:
    """Add a backend (or replace the entry of that name)."""
    _REGISTRY[backend.name] = backend


@contextmanager
def registered(backend: Backend) -> Iterator[Backend]:
    """`backend` registered for the block only (a test's own backend)."""
    previous = _REGISTRY.get(backend.name)
    register(backend)
    try:
        yield backend
    finally:
        if previous is None:
            _REGISTRY.pop(backend.name, None)
        else:
            _REGISTRY[backend.name] = previous


def get(name: str) -> Backend:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownBackend(f"backend must be one of {', '.join(names())}, got {name!r}") from None


def names() -> tuple[str, ...]:
    """The registered names, the default (postgres) first."""
    return tuple(_REGISTRY)


def all_backends() -> tuple[Backend, ...]:
    return tuple(_REGISTRY.values())


def with_connections() -> tuple[Backend, ...]:
    """The backends whose connection needs values of their own (`connection` and `resource`)."""
    return tuple(backend for backend in _REGISTRY.values() if backend.connection)


def _resolve(reference: str) -> Any:
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


register(
    Backend(
        name="postgres",
        datastore="runstate.wiring:postgres_datastore",
        event_store="runstate.eventstore.postgres:open_store",
        migrations="runstate.migrations.postgres",
    )
)
register(
    Backend(
        name="snowflake",
        datastore="runstate.wiring:snowflake_datastore",
        event_store="runstate.eventstore.snowflake:open_store",
        migrations="runstate.migrations.snowflake",
        needs="SNOWFLAKE_ACCOUNT (and user, password, ...), or the event_store resource's `snowflake`",
        connection="runstate.eventstore.config:snowflake_config",
        env_prefix="SNOWFLAKE_",
        resource="runstate.defs.eventstore.resources:SnowflakeConnection",
    )
)
