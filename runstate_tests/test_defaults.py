"""Each shared default is written once (runstate/defaults.py, or its one domain's module) and every layer
that takes it as a parameter default agrees with it."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from runstate import defaults
from runstate.config import Settings
from runstate.datastore import PostgresDatastore, SnowflakeDatastore
from runstate.datastore.postgres import CONNECT_TIMEOUT_S
from runstate.eventstore import EventStore, PostgresEventStore, SnowflakeEventStore
from runstate.eventstore.config import EventStoreConfig
from runstate.eventstore.lake.reader import LakeRunReader
from runstate.eventstore.snapshots import DEFAULT_SNAPSHOT_INTERVAL, SnapshotPolicy
from runstate.maintenance.store import MaintenanceStore
from runstate.services.moto import TEST_CREDENTIALS
from runstate.wal.clients import aws_client
from runstate.wal.dataset_tables.source import BlobLocation

PACKAGE = Path(__file__).resolve().parent.parent / "runstate"


def default_of(target: Any, parameter: str) -> Any:
    return inspect.signature(target).parameters[parameter].default


@pytest.mark.parametrize(
    "target, parameter, expected",
    [
        (PostgresDatastore, "schema", defaults.SCHEMA),
        (PostgresEventStore, "schema", defaults.SCHEMA),
        (MaintenanceStore, "schema", defaults.SCHEMA),
        (LakeRunReader, "namespace", defaults.SCHEMA),
        (Settings, "schema", defaults.SCHEMA),
        (Settings, "history_namespace", defaults.SCHEMA),
        (SnowflakeDatastore, "schema", defaults.SNOWFLAKE_SCHEMA),
        (SnowflakeEventStore, "schema", defaults.SNOWFLAKE_SCHEMA),
        (EventStoreConfig, "snowflake_schema", defaults.SNOWFLAKE_SCHEMA),
        (PostgresDatastore, "pool_size", defaults.POOL_SIZE),
        (SnowflakeDatastore, "pool_size", defaults.POOL_SIZE),
        (PostgresEventStore, "pool_size", defaults.POOL_SIZE),
        (SnowflakeEventStore, "pool_size", defaults.POOL_SIZE),
        (PostgresDatastore, "connect_timeout", CONNECT_TIMEOUT_S),
        (PostgresEventStore, "connect_timeout", CONNECT_TIMEOUT_S),
        (EventStore, "snapshot_interval", DEFAULT_SNAPSHOT_INTERVAL),
        (SnapshotPolicy, "interval", DEFAULT_SNAPSHOT_INTERVAL),
        (EventStoreConfig, "snapshot_interval", DEFAULT_SNAPSHOT_INTERVAL),
        (EventStore, "archive_to", Settings.archive_to),
        (aws_client, "region", defaults.AWS_REGION),
        (BlobLocation, "region", defaults.AWS_REGION),
        (Settings, "aws_region", defaults.AWS_REGION),
    ],
    ids=lambda value: getattr(value, "__qualname__", str(value)),
)
def test_every_layer_takes_the_shared_default(target: Any, parameter: str, expected: Any):
    assert default_of(target, parameter) == expected


def test_the_dev_services_use_the_default_region():
    assert TEST_CREDENTIALS["AWS_DEFAULT_REGION"] == defaults.AWS_REGION


@pytest.mark.parametrize(
    "literal, allowed",
    [
        # The S3 rule in wal/layout.py is AWS's (no LocationConstraint in us-east-1), not a default.
        ('"us-east-1"', {"defaults.py", "wal/layout.py"}),
        (r"pool_size: int = \d", set()),
        (r"snapshot_interval: int = \d", set()),
        (r'schema: str = "', set()),
    ],
)
def test_a_shared_default_is_written_as_a_literal_in_one_place(literal: str, allowed: set[str]):
    found = {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if re.search(literal, path.read_text(encoding="utf-8"))
    }

    assert found <= allowed, literal
