"""Errors of the dataset tables; they are WAL errors, so the CLI's one mapper prints them."""

from __future__ import annotations

from runstate.wal.errors import WalError


class DatasetTableError(WalError):
    """A dataset table could not be merged, rebuilt or read; the message names the dataset and table."""


class VersionNotFound(DatasetTableError):
    """Time travel to a version no merge of the table reached (or whose snapshot has expired)."""
