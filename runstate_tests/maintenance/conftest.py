"""Shared maintenance fixtures: a store in the test's schema (helpers: runstate_tests/support/maintenance.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from runstate.maintenance.store import MaintenanceStore


@pytest.fixture
def store(pg_database: str, pg_schema: str) -> Iterator[MaintenanceStore]:
    """A MaintenanceStore on the test's own database and schema, migrated."""
    with MaintenanceStore(pg_database, schema=pg_schema) as store:
        store.ensure_schema()
        yield store
