"""The global feed shared by both stores: follow fetch_all() from a position, waking on a signal."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from runstate.eventstore.contract import InvalidEvent, StoredEvent

log = logging.getLogger("runstate.eventstore.feed")

FEED_PAGE = 1000


def check_position(after_position: int, limit: int) -> None:
    if not isinstance(after_position, int) or isinstance(after_position, bool) or after_position < 0:
        raise InvalidEvent("after_position", f"must be a non-negative integer, got {after_position!r}")
    if not isinstance(limit, int) or limit < 1:
        raise InvalidEvent("limit", f"must be a positive integer, got {limit!r}")


def follow(
    fetch_page: Callable[[int, int], list[StoredEvent]],
    wait: Callable[[float], None],
    after_position: int,
    poll_seconds: float,
    stop: Callable[[], bool] | None,
) -> Iterator[StoredEvent]:
    """Every event after `after_position`, in position order, for as long as `stop()` is false:
    a full page is followed at once, otherwise `wait(poll_seconds)` (which returns early when the
    backend signals new events) comes before the next read."""
    check_position(after_position, FEED_PAGE)
    position = after_position
    while stop is None or not stop():
        page = fetch_page(position, FEED_PAGE)
        for event in page:
            yield event
            position = event.position or position
        if len(page) < FEED_PAGE:
            wait(poll_seconds)
