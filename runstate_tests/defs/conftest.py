"""Fixtures of the tests in this folder."""

from collections.abc import Iterator

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
