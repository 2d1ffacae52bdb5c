"""Errors of the WAL core; each message names the dataset, row or blob concerned."""

from __future__ import annotations


class WalError(Exception):
    """Base class of every WAL error."""


class WalInputError(WalError, ValueError):
    """Bad input to the producer (dataset id, key type, payload size...): nothing was written."""


class WalIntegrityError(WalError):
    """A stored WAL row is not what was written (checksum mismatch, missing seq): nothing was written."""


class WalContentionError(WalError):
    """Too many concurrent writers raced for the same dataset's seq counter or manifest; retry later."""


class BlobIntegrityError(WalError):
    """A blob or manifest is missing or does not match its recorded sha256; never read silently stale."""
