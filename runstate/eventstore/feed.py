"""The global feed shared by both stores: follow fetch_all() from a position, waking on a signal."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator

from runstate.eventstore.contract import InvalidEvent, StoredEvent

log = logging.getLogger("runstate.eventstore.feed")

FEED_PAGE = 1000
# What a store declares it can do (`EventStore.capabilities`), for the code that needs it to check instead
# of the store's class. GAP_FREE_FEED: fetch_all() never returns an event above one that commits later (a
# commit-ordered high-water mark: Postgres's), and the store bounds and names its feed for the run
# history (feed_bound, lake_owner, runs_created_at, export_query); only such a feed is exported.
GAP_FREE_FEED = "gap_free_feed"
MAX_POLL_SECONDS = 3600.0


def check_position(after_position: int, limit: int) -> None:
    if not isinstance(after_position, int) or isinstance(after_position, bool) or after_position < 0:
        raise InvalidEvent("after_position", f"must be a non-negative integer, got {after_position!r}")
    if not isinstance(limit, int) or limit < 1:
        raise InvalidEvent("limit", f"must be a positive integer, got {limit!r}")


def check_poll_seconds(poll_seconds: float) -> float:
    """A pause between reads: a finite number of seconds in (0, MAX_POLL_SECONDS] (NaN made a
    subscriber spin on Postgres and crash on Snowflake)."""
    if (
        not isinstance(poll_seconds, (int, float))
        or isinstance(poll_seconds, bool)
        or not math.isfinite(poll_seconds)
        or not 0 < poll_seconds <= MAX_POLL_SECONDS
    ):
        raise InvalidEvent(
            "poll_seconds",
            f"must be a number of seconds above 0 and at most {MAX_POLL_SECONDS:g}, got {poll_seconds!r}",
        )
    return float(poll_seconds)


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
    check_poll_seconds(poll_seconds)
    position = after_position
    while stop is None or not stop():
        page = fetch_page(position, FEED_PAGE)
        for event in page:
            yield event
            position = event.position or position
        if len(page) < FEED_PAGE:
            wait(poll_seconds)
