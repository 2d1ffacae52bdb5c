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
  `applied(datastore, domain, migrations, *, pooled)`; None for a backend that keeps no schema.

A datastore knows its backend's name (`datastore.backend`), so code holding one (the migrations, say)
finds its entry with `get(datastore.backend)`. Adding a backend is its module, its `sql/<backend>/`
folder and one `register(...)` (docs/ARCHITECTURE.md).
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

    def build_datastore(self, config: Any, **options: Any) -> Any:
        """The backend's datastore from the event store's config, or None when it has no connection for it."""
        return _resolve(self.datastore)(config, **options)

    def open_event_store(self, datastore: Any, **options: Any) -> Any:
        """The run state store on `datastore`; closing the store closes the datastore."""
        return _resolve(self.event_store)(datastore, **options)

    def migrations_module(self) -> ModuleType | None:
        return importlib.import_module(self.migrations) if self.migrations else None


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
    )
)
