"""The Postgres store's global feed: how a page stays gap-free, and FeedListener, which wakes subscribers
(sql/postgres/eventstore/002_event_feed.sql; the reads are feed.sql's queries, run by postgres.py's `feed`).

A read returns only events whose position is below (horizon << 20), the horizon being the oldest
transaction its own snapshot sees in progress: every transaction with a lower id has ended, so no
event can appear later below what was returned. Transactions of other databases cannot write these
tables and do not count; they are listed in a statement of their own before the read (feed.sql says
why). The price: a transaction held open in this database holds the feed back until it ends (it never
makes it skip).
LISTEN runstate_feed wakes subscribers at each commit; they also poll, so a lost notification (or
a LISTEN connection that cannot be had) only delays them by `poll_seconds`. A lost LISTEN
connection is opened again (with backoff), so a server restart does not leave them polling.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from runstate import sqlfiles
from runstate.eventstore.contract import one_line

log = logging.getLogger("runstate.eventstore.postgres")

FEED_CHANNEL = "runstate_feed"
_MAX_BACKOFF_S = 30.0


@contextmanager
def listening(conninfo: str, schema: str) -> Iterator[Callable[[float], None]]:
    """A subscriber's wait(seconds): until a notification arrives or the seconds pass."""
    listener = FeedListener(conninfo, schema)
    try:
        yield listener.wait
    finally:
        listener.close()


class FeedListener:
    """LISTEN runstate_feed on a connection of its own. A lost connection (a server restart, a
    terminated backend) is opened again at once, then after 1, 2, 4 .. 30 s while that fails;
    meanwhile the subscriber polls, so it only waits up to its poll interval for new events."""

    def __init__(self, conninfo: str, schema: str, clock: Callable[[], float] = time.monotonic):
        self._conninfo = conninfo
        self._schema = schema
        self._clock = clock
        self._conn: psycopg.Connection | None = None
        self._failures = 0
        self._next_attempt = 0.0
        self._connect()

    def _connect(self) -> None:
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=10)
            conn.execute(f"LISTEN {FEED_CHANNEL}")
        except psycopg.Error as exc:
            self._failures += 1
            backoff = min(_MAX_BACKOFF_S, 2.0 ** (self._failures - 1))
            self._next_attempt = self._clock() + backoff
            log.warning(
                "feed of schema %r: LISTEN unavailable (%s); polling, next try in %.0f s",
                self._schema,
                one_line(exc),
                backoff,
            )
            return
        if self._failures:
            log.info("feed of schema %r: listening again", self._schema)
        self._conn, self._failures = conn, 0

    def wait(self, seconds: float) -> None:
        """Until a notification arrives or `seconds` pass."""
        if self._conn is None and self._clock() >= self._next_attempt:
            self._connect()
        if self._conn is None:
            time.sleep(seconds)
            return
        try:
            for _ in self._conn.notifies(timeout=seconds, stop_after=1):
                pass
        except psycopg.Error as exc:
            log.warning("feed of schema %r: listener lost (%s); reconnecting", self._schema, one_line(exc))
            self.close()
            self._connect()  # at once: the events missed meanwhile are read by the next poll anyway

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


feed_query = sqlfiles.named("postgres", "eventstore", "feed.sql")


def feed_page_params(conn: psycopg.Connection, after_position: int, limit: int) -> dict[str, Any]:
    """The parameters of a feed page's statement (feed, feed_bound): the transactions of other databases
    are listed first, in a statement of their own (feed.sql says why)."""
    other_xids = conn.execute(feed_query("other_databases_xids")).fetchone()[0]
    return {"after": after_position, "limit": limit, "other_xids": other_xids}
