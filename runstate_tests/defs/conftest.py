"""Fixtures of the tests in this folder."""

# The WAL shell fixtures: a WAL table and bucket of the test's own, and a Dagster instance on disk.
from runstate_tests.wal.shell import instance, world  # noqa: F401
