"""The maintenance domain's errors: one root, `MaintenanceError`, that the CLI maps to one line.

Each class also keeps the builtin base it had before the root existed (ValueError, LookupError,
RuntimeError), so callers that caught those keep working.
"""

from __future__ import annotations


class MaintenanceError(Exception):
    """Root of every error the maintenance core raises on purpose."""


class InvalidInput(MaintenanceError, ValueError):
    """A value that fails validation at the edge; nothing was written."""


class InvalidIdentifier(InvalidInput):
    """A database, table or other name that is not a plain SQL identifier."""


class UnknownAction(InvalidInput):
    """A maintenance action that is not in `ACTIONS` (or no action at all)."""


class InvalidActionOption(InvalidInput):
    """A maintenance option that breaks its rules (unknown key, bad type, range or sort order)."""


class InvalidStatus(InvalidInput):
    """A job status outside the ones the operation accepts."""


class TableNotCached(MaintenanceError, LookupError):
    """submit() for a table that the catalog cache (table_cache_entries) does not list."""


class JobNotFound(MaintenanceError, LookupError):
    """A job id that is not in `jobs`."""


class TableNotFound(MaintenanceError, LookupError):
    """A table the `lake` catalog does not have."""


class TableLocked(MaintenanceError, RuntimeError):
    """Another job holds the table lock; the job was not run and its lease will expire for a retry."""


class StoreError(MaintenanceError):
    """Postgres refused or failed a maintenance statement (the driver's error is the __cause__)."""


class StoreUnavailable(StoreError, ConnectionError):
    """The maintenance store's Postgres could not be reached or dropped the connection."""


__all__ = [
    "InvalidActionOption",
    "InvalidIdentifier",
    "InvalidInput",
    "InvalidStatus",
    "JobNotFound",
    "MaintenanceError",
    "StoreError",
    "StoreUnavailable",
    "TableLocked",
    "TableNotCached",
    "TableNotFound",
    "UnknownAction",
]
