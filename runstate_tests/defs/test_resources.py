"""runstate.defs.resources: each resource holds its domain's config (its fields derived from the config's:
types, defaults, descriptions and bounds), is built from the settings through that config, and opens its
connections as the CLI does."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import dagster as dg
import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from runstate.cli import main
from runstate.config import Settings
from runstate.defs.config_fields import config_resource
from runstate.defs.eventstore.jobs import append_events
from runstate.defs.eventstore.resources import EventStoreResource, SnowflakeConnection
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.defs.resources import event_store_resource, maintenance_resource, wal_resource
from runstate.defs.wal.resources import WalResource
from runstate.eventstore.config import SNOWFLAKE_LOGIN_TIMEOUT_S, EventStoreConfig, SnowflakeConfig
from runstate.maintenance.config import MaintenanceConfig
from runstate.wal.config import WalConfig

# Each resource, its config, and the fields that are the resource's own (how it opens, not what).
HOLDERS = [
    (EventStoreResource, EventStoreConfig, {"ensure_schema"}),
    (SnowflakeConnection, SnowflakeConfig, set()),
    (WalResource, WalConfig, set()),
    (MaintenanceResource, MaintenanceConfig, {"ensure_schema"}),
]
SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "SNOWFLAKE_PASSWORD")


@pytest.mark.parametrize(
    "resource_type, config_type, own_fields", HOLDERS, ids=lambda h: getattr(h, "__name__", "")
)
def test_a_resource_s_fields_are_its_config_s_with_their_types_defaults_and_descriptions(
    resource_type, config_type, own_fields
):
    # A connection of a backend's own is held as its resource (runstate.backends: `resource`).
    nested = {"snowflake": SnowflakeConnection | None}
    types = typing.get_type_hints(config_type)
    config_fields = {field.name: field for field in dataclasses.fields(config_type)}

    assert set(resource_type.model_fields) - own_fields == set(config_fields)
    for name, field in config_fields.items():
        held = resource_type.model_fields[name]
        assert held.annotation == nested.get(name, types[name]), name
        assert held.is_required() == (field.default is dataclasses.MISSING), name
        assert held.is_required() or held.default == field.default, name
        # Every knob has its words in the UI, written in the config.
        assert held.description and held.description == field.metadata["description"], name


def test_a_resource_refuses_a_value_out_of_its_config_s_bounds():
    bounded = {field.name: field.metadata for field in dataclasses.fields(WalConfig)}
    assert bounded["max_batch_size"]["gt"] == 0 and bounded["retention_days"]["ge"] == 0

    for name, metadata in bounded.items():
        if "gt" in metadata:
            with pytest.raises(ValidationError, match=name):
                WalResource(**{name: metadata["gt"]})
        if "ge" in metadata:
            with pytest.raises(ValidationError, match=name):
                WalResource(**{name: metadata["ge"] - 1})


def test_a_config_field_s_metadata_says_only_what_its_resource_field_takes():
    @dataclasses.dataclass(frozen=True)
    class Mistyped:
        size: int = dataclasses.field(default=1, metadata={"descripton": "A typo, not a description."})

    with pytest.raises(TypeError, match=r"Mistyped.size: unknown metadata \['descripton'\]"):
        config_resource(Mistyped)


def test_a_job_s_launchpad_shows_each_resource_s_config_fields_with_their_defaults_and_descriptions():
    @dg.op
    def holds_them(
        event_store: EventStoreResource,
        snowflake: SnowflakeConnection,
        wal: WalResource,
        maintenance: MaintenanceResource,
    ) -> None:
        pass

    @dg.job
    def every_resource() -> None:
        holds_them()

    snowflake = SnowflakeConfig(account="acct")
    configs = {
        "event_store": EventStoreConfig(),
        "snowflake": snowflake,
        "wal": WalConfig(),
        "maintenance": MaintenanceConfig(),
    }
    resources = {
        "event_store": EventStoreResource(),
        "snowflake": SnowflakeConnection(account="acct"),
        "wal": WalResource(),
        "maintenance": MaintenanceResource(),
    }
    job = dg.Definitions(jobs=[every_resource], resources=resources).get_job_def("every_resource")
    launchpad = job.run_config_schema.config_type.fields["resources"].config_type.fields

    for key, config in configs.items():
        shown = launchpad[key].config_type.fields["config"].config_type.fields
        for field in dataclasses.fields(config):
            if key == "event_store" and field.name == "snowflake":  # a nested resource: `snowflake` above
                continue
            held = shown[field.name]
            assert held.description == field.metadata["description"], (key, field.name)
            if field.default is dataclasses.MISSING:  # required: its value is the resource's, not a default
                assert held.is_required, (key, field.name)
            else:
                assert held.default_value == getattr(config, field.name), (key, field.name)


def test_a_resource_of_defaults_holds_the_default_config():
    assert WalResource().config() == WalConfig()
    assert MaintenanceResource().config() == MaintenanceConfig()
    assert EventStoreResource().config() == EventStoreConfig()


def test_the_event_store_resource_refuses_a_bad_archive_target():
    with pytest.raises(ValueError, match="archive_to must be one of postgres, lake, got 's3'"):
        EventStoreResource(archive_to="s3")
    assert EventStoreResource(archive_to="lake").config().archive_to == "lake"


def test_the_built_resources_hold_the_configs_of_the_settings(monkeypatch: pytest.MonkeyPatch):
    for name in SECRETS:  # set, they are passed as EnvVars: the same values, not in the run config
        monkeypatch.delenv(name, raising=False)
    s = Settings.from_env(
        {
            "RUNSTATE_PG_URL": "postgresql://u@127.0.0.1:1/db",
            "RUNSTATE_SCHEMA": "s1",
            "RUNSTATE_AWS_ENDPOINT_URL": "http://127.0.0.1:1",
            "RUNSTATE_WAL_FLUSH_LINGER_S": "7.5",
            "RUNSTATE_MAINTENANCE_WORKERS": "5",
            "RUNSTATE_EVENTSTORE": "snowflake",
            "SNOWFLAKE_ACCOUNT": "acct",
            "SNOWFLAKE_PASSWORD": "pw",
            "SNOWFLAKE_PORT": "8123",
            "SNOWFLAKE_SCHEMA": "runs",
            "RUNSTATE_ARCHIVE_TO": "lake",
            "RUNSTATE_HISTORY_NAMESPACE": "audit",
        }
    )

    assert event_store_resource(s).config() == EventStoreConfig.from_settings(s)
    assert wal_resource(s).config() == WalConfig.from_settings(s)
    assert maintenance_resource(s).config() == MaintenanceConfig.from_settings(s)


def test_snowflake_connections_get_the_same_arguments_from_the_cli_and_from_the_resource(
    snowflake_settings, monkeypatch: pytest.MonkeyPatch
):
    """Every connection the Dagster resource makes in a run, and every one the CLI makes, is given the
    same arguments (before, the resource's lost the login timeout)."""
    import snowflake.connector

    kwargs, _ = snowflake_settings
    made: list[dict[str, Any]] = []
    connect = snowflake.connector.connect

    def connect_and_record(**arguments: Any) -> Any:
        made.append(arguments)
        return connect(**arguments)

    monkeypatch.setattr(snowflake.connector, "connect", connect_and_record)
    run = append_events.execute_in_process(  # migrates the schema too (ensure_schema)
        run_config={
            "ops": {
                "append_events_op": {"config": {"run_id": "r1", "events": [{"event_type": "RunStarted"}]}}
            }
        },
        resources={"event_store": event_store_resource()},
    )
    by_the_resource, made[:] = list(made), []
    shown = CliRunner().invoke(main, ["events", "show", "r1"])

    assert run.success and shown.exit_code == 0, shown.output
    assert by_the_resource and made
    assert _distinct(by_the_resource) == _distinct(made) and len(_distinct(made)) == 1
    assert made[0]["login_timeout"] == SNOWFLAKE_LOGIN_TIMEOUT_S and made[0]["password"] == kwargs["password"]


def _distinct(arguments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [each for index, each in enumerate(arguments) if each not in arguments[:index]]
