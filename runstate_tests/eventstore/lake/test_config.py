"""The run history's configuration: one frozen HistoryConfig from the Settings, every knob bounded."""

from __future__ import annotations

import re

import pytest

from runstate.config import ConfigError, Settings
from runstate.eventstore.config import EventStoreConfig
from runstate.eventstore.lake import HistoryConfig


def test_the_settings_make_one_frozen_config():
    s = Settings.from_env(
        {
            "RUNSTATE_HISTORY_NAMESPACE": "audit",
            "RUNSTATE_HISTORY_BATCH_EVENTS": "500",
            "RUNSTATE_HISTORY_EXPORT_INTERVAL_S": "30",
            "RUNSTATE_HISTORY_MAX_LAG_EVENTS": "7",
            "RUNSTATE_HISTORY_MAX_LAG_MINUTES": "3",
        }
    )

    config = HistoryConfig.from_settings(s)

    assert config == HistoryConfig("audit", 500, 7, 3, 30)
    assert (config.events_table, config.runs_table) == ("lake.audit.run_events", "lake.audit.runs")
    assert HistoryConfig.from_settings(Settings.from_env({})) == HistoryConfig()
    with pytest.raises(AttributeError):
        config.namespace = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RUNSTATE_HISTORY_NAMESPACE", "Runs"),
        ("RUNSTATE_HISTORY_NAMESPACE", "runs; DROP TABLE x"),
        ("RUNSTATE_HISTORY_NAMESPACE", "9lives"),
        ("RUNSTATE_HISTORY_BATCH_EVENTS", "0"),
        ("RUNSTATE_HISTORY_BATCH_EVENTS", "1000001"),
        ("RUNSTATE_HISTORY_EXPORT_INTERVAL_S", "4"),
        ("RUNSTATE_HISTORY_MAX_LAG_EVENTS", "-1"),
        ("RUNSTATE_HISTORY_MAX_LAG_MINUTES", "1441"),
    ],
)
def test_a_value_out_of_bounds_is_an_error_naming_the_variable(name, value):
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: value})


def test_a_namespace_that_is_not_an_identifier_is_refused_before_any_sql():
    with pytest.raises(ValueError, match="lower-case identifier"):
        HistoryConfig(namespace="lake.evil")


def test_archive_to_is_postgres_unless_set_to_lake_and_reaches_the_store_config():
    lake = Settings.from_env({"RUNSTATE_ARCHIVE_TO": "lake", "RUNSTATE_HISTORY_NAMESPACE": "audit"})

    assert Settings.from_env({}).archive_to == "postgres" == EventStoreConfig().archive_to
    config = EventStoreConfig.from_settings(lake)
    assert (config.archive_to, config.lake_namespace, config.lake_warehouse) == (
        "lake",
        "audit",
        str(lake.warehouse_dir),
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RUNSTATE_ARCHIVE_TO": "s3"}, "RUNSTATE_ARCHIVE_TO must be one of postgres, lake, got 's3'"),
        ({"RUNSTATE_ARCHIVE_TO": "Lake"}, "RUNSTATE_ARCHIVE_TO must be one of postgres, lake, got 'Lake'"),
        (
            {"RUNSTATE_ARCHIVE_TO": "lake", "RUNSTATE_ICEBERG_CATALOG": "hadoop"},
            "RUNSTATE_ARCHIVE_TO=lake needs RUNSTATE_ICEBERG_CATALOG=jdbc",
        ),
    ],
)
def test_a_bad_archive_target_is_a_config_error_naming_the_variable(env, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        Settings.from_env(env)


def test_the_store_config_refuses_a_bad_archive_target():
    with pytest.raises(ValueError, match="RUNSTATE_ARCHIVE_TO must be one of postgres, lake, got 'ftp'"):
        EventStoreConfig(archive_to="ftp")


def test_the_namespace_follows_the_stores_schema_unless_set():
    """Two stores in one database must not share lake tables (issue 51): schema b's history is lake.b.*,
    the default schema's stays lake.runstate.*; RUNSTATE_HISTORY_NAMESPACE still wins."""

    def namespace(**env: str) -> str:
        return HistoryConfig.from_settings(Settings.from_env(env)).namespace

    assert namespace() == "runstate"
    assert (
        namespace(RUNSTATE_SCHEMA="b")
        == "b"
        == EventStoreConfig.from_settings(Settings.from_env({"RUNSTATE_SCHEMA": "b"})).lake_namespace
    )
    assert namespace(RUNSTATE_SCHEMA="Audit_2") == "audit_2"
    assert namespace(RUNSTATE_SCHEMA="b", RUNSTATE_HISTORY_NAMESPACE="shared") == "shared"
    with pytest.raises(ConfigError, match="RUNSTATE_SCHEMA: schema name .b-c. must match"):
        namespace(RUNSTATE_SCHEMA="b-c")
