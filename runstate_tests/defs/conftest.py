"""Fixtures of the tests in this folder."""

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from runstate.defs.eventstore.resources import EventStoreResource
from runstate.eventstore import PostgresEventStore

# The WAL shell fixtures: a WAL table and bucket of the test's own, and a Dagster instance on disk.
from runstate_tests.wal.shell import instance, world  # noqa: F401


@pytest.fixture
def resource(pg_database: str, pg_schema: str) -> EventStoreResource:
    """The event store resource on the test's own database and schema."""
    return EventStoreResource(backend="postgres", pg_url=pg_database, pg_schema=pg_schema)


@pytest.fixture
def store(resource: EventStoreResource) -> Iterator[PostgresEventStore]:
    """The resource's store (schema applied), closed after the test."""
    yield resource.get_store()
    resource.close()


@pytest.fixture
def bare_instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    """An on-disk instance of the test's own, without the WAL world's table and bucket."""
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with dg.DagsterInstance.from_config(str(tmp_path)) as inst:
        yield inst
