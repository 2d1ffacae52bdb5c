"""Adding a backend is its module(s), its sql/<backend>/ folder and one `runstate.backends` entry: here a
thin backend, the Postgres store under another name, registered by one entry and opened both ways the
deployment opens a store (the Settings through `wiring`, and the Dagster resource), with nothing else
told about it."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from runstate import backends, wiring
from runstate.config import Settings
from runstate.datastore import PostgresDatastore
from runstate.defs.eventstore.resources import EventStoreResource
from runstate.defs.resources import event_store_resource
from runstate.eventstore import NewEvent, PostgresEventStore
from runstate.eventstore.config import EventStoreConfig

TWIN = backends.Backend(
    name="pgtwin",
    datastore="runstate.wiring:postgres_datastore",
    event_store=f"{__name__}:open_twin",
    migrations="runstate.migrations.postgres",
)


class TwinEventStore(PostgresEventStore):
    """The Postgres store, as another backend's module would define its own."""


def open_twin(datastore: PostgresDatastore, **options: Any) -> TwinEventStore:
    return TwinEventStore(datastore=datastore, schema=datastore.schema, **options).owning_datastore()


def test_one_entry_makes_a_backend_the_settings_wiring_and_the_resource_open(pg_database, pg_schema):
    started = NewEvent("r1", "RunStarted", datetime(2026, 1, 1, tzinfo=UTC))
    with backends.registered(TWIN):
        s = Settings.from_env(
            {"RUNSTATE_EVENTSTORE": "pgtwin", "RUNSTATE_PG_URL": pg_database, "RUNSTATE_SCHEMA": pg_schema}
        )
        with wiring.event_store(EventStoreConfig.from_settings(s)) as store:
            store.ensure_schema()
            store.append(started)
        resource = event_store_resource(s)
        try:
            through_resource = resource.get_store()
            stored = through_resource.fetch("r1")
        finally:
            resource.close()

    assert type(store) is TwinEventStore and type(through_resource) is TwinEventStore
    assert resource.backend == "pgtwin" and through_resource.schema == pg_schema
    assert [(e.run_seq, e.event_type) for e in stored] == [(1, "RunStarted")]


def test_the_resource_refuses_a_backend_no_entry_names():
    with pytest.raises(ValueError, match="backend must be one of postgres, snowflake, got 'pgtwin'"):
        EventStoreResource(backend="pgtwin")


def test_an_entry_whose_connection_has_no_resource_is_refused():
    with pytest.raises(ValueError, match="'half': a connection of its own needs a resource"):
        backends.Backend("half", TWIN.datastore, TWIN.event_store, None, connection="m:parse")


def test_a_connection_with_no_config_field_to_hold_it_is_named():
    entry = backends.Backend(
        "elsewhere", TWIN.datastore, TWIN.event_store, None, connection="m:parse", resource="m:Resource"
    )
    with backends.registered(entry), pytest.raises(TypeError, match="'elsewhere' has a connection"):
        EventStoreConfig.from_settings(Settings.from_env({}))


def test_the_snowflake_entry_carries_its_connection_and_its_resource():
    entry = backends.get("snowflake")
    s = Settings.from_env({"SNOWFLAKE_ACCOUNT": "acct", "SNOWFLAKE_USER": "me"})

    config = entry.connection_config(s)
    resource = entry.connection_resource(config)

    assert (config.account, config.user) == ("acct", "me")
    assert resource.config() == config
    assert EventStoreConfig.from_settings(s).snowflake == config
    assert entry.connection_config(Settings.from_env({"SNOWFLAKE_ACCOUNT": ""})) is None
    assert backends.with_connections() == (entry,)


def test_the_settings_keep_a_registered_backend_s_own_variables():
    entry = dataclasses.replace(TWIN, env_prefix="PGTWIN_")
    with backends.registered(entry):
        s = Settings.from_env({"PGTWIN_HOST": "db.example", "PGTWIN_PORT": "6543", "SNOWFLAKE_USER": "me"})

    assert s.backend_env["pgtwin"] == {"host": "db.example", "port": "6543"}
    assert s.snowflake["user"] == "me" and "user" not in s.backend_env["pgtwin"]
