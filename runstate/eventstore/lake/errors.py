"""Errors of the run history in the lake; event store errors, so the CLI's one mapper prints them."""

from __future__ import annotations

from runstate.eventstore.contract import EventStoreError


class HistoryError(EventStoreError):
    """The run history could not be exported or read; the message names the table."""


class HistoryConflict(HistoryError):
    """Another export committed after this one read the table's position: nothing of this one was written."""


class FeedRefused(HistoryError):
    """The store's feed may skip an event that commits late, so no history is exported from it."""


class ForeignHistory(HistoryError):
    """The history table belongs to another event store (its OWNER_PROPERTY names that store), or records
    no owner where one is required: nothing was read, written or deleted."""
