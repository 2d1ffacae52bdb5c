"""Logging for the CLI: plain text for people, one JSON object per line for log pipelines."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

# Attributes every LogRecord has; anything else was passed through `extra=` and is structured context.
_RECORD_FIELDS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, sort_keys=True)


def configure(level: str = "WARNING", fmt: str = "text") -> None:
    """Route the `runstate` loggers to stderr in the chosen format; dagster keeps its own handlers."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if fmt == "json" else logging.Formatter("%(levelname)s %(name)s: %(message)s")
    )
    logger = logging.getLogger("runstate")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
