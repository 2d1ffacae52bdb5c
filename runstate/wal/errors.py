"""Errors of the WAL core; each message names the dataset, row or blob concerned."""

from __future__ import annotations


class WalError(Exception):
    """Base class of every WAL error."""


class WalInputError(WalError, ValueError):
    """Bad input to the producer (dataset id, key type, payload size...): nothing was written."""


class WalEncodingError(WalInputError):
    """A key or value that UTF-8 cannot encode (a lone surrogate): no DynamoDB string can hold it."""


class WalIntegrityError(WalError):
    """A stored WAL row is not what was written (checksum mismatch, missing seq): nothing was written."""


class WalServiceError(WalError):
    """DynamoDB or S3 failed or could not be reached; the message names the table or bucket and the endpoint."""


class WalContentionError(WalError):
    """Too many concurrent writers raced for the same dataset's seq counter or manifest; retry later."""


class BlobIntegrityError(WalError):
    """A blob or manifest is missing or does not match its recorded sha256; never read silently stale."""
