"""SnowflakeEventStore (stub; being implemented)."""
from __future__ import annotations

from typing import Any


class SnowflakeEventStore:
    def __init__(self, connection_factory: Any = None, *, schema: str = "RUNSTATE", snapshot_interval: int = 100, **kwargs: Any):
        raise NotImplementedError
