"""Postgres -> Snowflake event migration (stub; being implemented)."""
from __future__ import annotations


def migrate_events(source, target, *, batch_size: int = 1000, progress=None):
    raise NotImplementedError


def verify_migration(source, target, run_ids=None):
    raise NotImplementedError
