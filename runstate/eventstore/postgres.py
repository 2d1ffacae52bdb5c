"""PostgresEventStore (stub; being implemented)."""
from __future__ import annotations

from typing import Any


class PostgresEventStore:
    def __init__(self, dsn: str, *, schema: str = "runstate", snapshot_interval: int = 100, **kwargs: Any):
        raise NotImplementedError
