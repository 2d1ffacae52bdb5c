"""Fixtures of the tests in this folder."""

from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from runstate.config import settings

# The WAL shell fixtures: a WAL table and bucket of the test's own, and a Dagster instance on disk.
from runstate_tests.wal.shell import WalWorld, instance, world  # noqa: F401


@pytest.fixture
def wal_cli(
    world: WalWorld,  # noqa: F811 - the fixture imported above, requested by name
    pg_database: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[CliRunner]:
    """The CLI pointed at the test's moto table/bucket, a Dagster home of its own (cursor kept), and the
    worker's database for the shard fences."""
    monkeypatch.setenv("RUNSTATE_AWS_ENDPOINT_URL", world.endpoint)
    monkeypatch.setenv("RUNSTATE_PG_URL", pg_database)
    monkeypatch.setenv("RUNSTATE_WAL_TABLE", world.table)
    monkeypatch.setenv("RUNSTATE_BLOB_BUCKET", world.bucket)
    monkeypatch.setenv("RUNSTATE_BLOB_PREFIX", world.prefix)
    monkeypatch.setenv("DAGSTER_HOME", str(world.home))
    settings.cache_clear()
    yield CliRunner()
    settings.cache_clear()
