"""The global feed: fetch_all and subscribe, in position order, never skipping a late commit."""

from __future__ import annotations

import random
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from runstate.eventstore import InvalidEvent, StoredEvent
from runstate.eventstore.feed import GAP_FREE_FEED
from runstate.eventstore.lake.errors import FeedRefused
from runstate.eventstore.lake.export import check_feed
from runstate_tests.support.databases import ADMIN_URL
from runstate_tests.support.events import ev

WRITERS = 8
BATCHES_PER_WRITER = 12


def collect(store: Any, expected: int, deadline_s: float, poll: float = 0.5) -> list[StoredEvent]:
    """Subscribe from 0 until `expected` events arrived or the deadline passed."""
    got: list[StoredEvent] = []
    deadline = time.monotonic() + deadline_s
    for event in store.subscribe(
        0, poll_seconds=poll, stop=lambda: len(got) >= expected or time.monotonic() > deadline
    ):
        got.append(event)
    return got


def test_fetch_all_pages_every_run_in_position_order(store):
    for i in range(5):
        store.append_batch(f"run-{i}", [ev(f"run-{i}", "A", key=f"a{i}"), ev(f"run-{i}", "B", key=f"b{i}")])

    pages, after = [], 0
    while page := store.fetch_all(after, limit=3):
        pages.append(page)
        after = page[-1].position

    events = [e for page in pages for e in page]
    assert [len(p) for p in pages] == [3, 3, 3, 1]
    assert [(e.run_id, e.run_seq) for e in events] == [(f"run-{i}", s) for i in range(5) for s in (1, 2)]
    assert all(a.position < b.position for a, b in zip(events, events[1:]))


def test_fetch_all_refuses_bad_arguments(store):
    with pytest.raises(InvalidEvent):
        store.fetch_all(-1)
    with pytest.raises(InvalidEvent):
        store.fetch_all(0, limit=0)


def test_subscribe_follows_new_appends(store):
    store.append(ev("r1", "A"))
    later = threading.Timer(0.5, lambda: store.append(ev("r2", "B")))
    later.start()

    got = collect(store, expected=2, deadline_s=60)

    later.join()
    assert [(e.run_id, e.event_type) for e in got] == [("r1", "A"), ("r2", "B")]


def _raw_append(store: Any, conn: psycopg.Connection, run_id: str, events: list) -> None:
    """One append transaction through the store's own insert path, on a connection the test owns."""
    from runstate.eventstore.validation import validate_batch

    valid = validate_batch(run_id, events)
    store.appender._append_tx(
        conn, run_id=run_id, valid=valid, state=None, expected=None, ticket=None, probe=False
    )


def follow_until_caught_up(
    store: Any,
    all_committed: threading.Event,
    committed: set[str],
    linger_s: float = 1.0,
    deadline_s: float = 60,
) -> list[StoredEvent]:
    """Subscribe from 0 until, every writer done, each committed key has arrived and `linger_s` more passed
    (an event delivered twice would come in that time too), or the deadline passed."""
    got: list[StoredEvent] = []
    deadline = time.monotonic() + deadline_s
    caught_up_at: list[float] = []

    def stop() -> bool:
        now = time.monotonic()
        if not caught_up_at and all_committed.is_set() and committed <= {e.idempotency_key for e in got}:
            caught_up_at.append(now)
        return now > deadline or bool(caught_up_at) and now > caught_up_at[0] + linger_s

    for event in store.subscribe(0, poll_seconds=0.3, stop=stop):
        got.append(event)
    return got


def test_eight_writers_with_rollbacks_and_a_long_transaction_lose_nothing(pg_store, pg_database, pg_schema):
    """Every committed event reaches a subscriber exactly once, in position order, none skipped,
    although one transaction stays open for seconds while the others commit past it."""
    store = pg_store
    conninfo = store.datastore.conninfo
    committed: set[str] = set()
    lock = threading.Lock()
    long_started, others_done = threading.Event(), threading.Event()

    def long_transaction() -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn, conn.transaction():
            _raw_append(store, conn, "long", [ev("long", "Slow", i, key=f"long-{i}") for i in range(3)])
            long_started.set()
            others_done.wait(timeout=120)
            time.sleep(1.0)  # commit well after every later transaction
        with lock:
            committed.update(f"long-{i}" for i in range(3))

    def writer(w: int) -> None:
        rng = random.Random(w)
        long_started.wait(timeout=60)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            for b in range(BATCHES_PER_WRITER):
                keys = [f"w{w}-b{b}-{i}" for i in range(rng.randint(1, 4))]
                run_id = f"run-{w}"
                events = [ev(run_id, "Tick", i, key=key) for i, key in enumerate(keys)]
                rollback = rng.random() < 0.3
                with conn.transaction(force_rollback=rollback):
                    _raw_append(store, conn, run_id, events)
                if not rollback:
                    with lock:
                        committed.update(keys)

    threads = [threading.Thread(target=long_transaction)] + [
        threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)
    ]
    got: list[StoredEvent] = []
    all_committed = threading.Event()  # set once every writer and the long transaction are done
    subscriber = threading.Thread(
        target=lambda: got.extend(follow_until_caught_up(store, all_committed, committed))
    )
    for thread in threads:
        thread.start()
    subscriber.start()
    for thread in threads[1:]:
        thread.join()
    others_done.set()
    threads[0].join()
    all_committed.set()
    subscriber.join()

    keys = [e.idempotency_key for e in got]
    assert len(keys) == len(set(keys)), "an event was delivered twice"
    assert set(keys) == committed, (
        f"missing {sorted(committed - set(keys))[:5]}, extra {sorted(set(keys) - committed)[:5]}"
    )
    assert all(a.position < b.position for a, b in zip(got, got[1:]))
    assert keys.index("long-0") < keys.index("long-1") < keys.index("long-2")


def test_a_transaction_open_in_another_database_does_not_hold_the_feed_back(pg_store):
    """Its xid is older than the appends' and in the read's snapshot; it is listed as another database's
    before the read, so the read passes it (one of this database's would hold the read below it)."""
    with psycopg.connect(ADMIN_URL) as elsewhere:
        elsewhere.execute("SELECT pg_current_xact_id()")  # a transaction with an xid, left open
        pg_store.append(ev("r1", "A"))
        pg_store.append(ev("r2", "B"))

        assert [e.run_id for e in pg_store.fetch_all()] == ["r1", "r2"]


def test_feed_bound_counts_the_page_fetch_all_returns_without_reading_it(pg_store):
    """The run history's export bounds a batch with feed_bound, then reads it through Spark: the count and
    the last position must be fetch_all's, archived events included, and an open transaction that wrote
    events holds both back alike (its events and every later one)."""
    for i in range(4):
        pg_store.append_batch(
            f"run-{i}", [ev(f"run-{i}", "RunStarted", key=f"s{i}"), ev(f"run-{i}", "RunCompleted", 1)]
        )
    assert pg_store.archive(0, now=datetime.now(UTC) + timedelta(days=1)) == 8  # all in run_events_archive
    pg_store.append(ev("live", "RunStarted"))

    def agrees(after: int, limit: int) -> tuple[int, int]:
        page = pg_store.fetch_all(after, limit)
        bound = pg_store.feed_bound(after, limit)
        assert bound == (len(page), page[-1].position if page else after)
        return bound

    assert agrees(0, 100)[0] == 9
    three = agrees(0, 3)
    assert three[0] == 3 and agrees(three[1], 100)[0] == 6
    with psycopg.connect(pg_store.datastore.conninfo, autocommit=True) as conn, conn.transaction():
        _raw_append(pg_store, conn, "open", [ev("open", "RunStarted", key="open-0")])
        pg_store.append(ev("after-open", "RunStarted"))
        assert agrees(0, 100)[0] == 9  # neither the open one's event nor the later one
    assert agrees(0, 100)[0] == 11
    assert agrees(agrees(0, 100)[1], 10) == (0, agrees(0, 100)[1])
    with pytest.raises(InvalidEvent):
        pg_store.feed_bound(-1, 10)


def test_runs_created_at_is_when_the_store_first_saw_each_run_and_never_moves(pg_store):
    """The run history partitions its runs table by it: a later append or an archive must not change it."""
    before = datetime.now(UTC)
    pg_store.append(ev("early", "RunStarted"))
    created = pg_store.runs_created_at(["early", "unknown"])
    assert list(created) == ["early"] and before - timedelta(seconds=5) <= created["early"] <= datetime.now(
        UTC
    )
    pg_store.append(ev("early", "RunCompleted", 1))
    pg_store.archive(0, now=datetime.now(UTC) + timedelta(days=1))
    assert pg_store.runs_created_at(["early"]) == created


def test_a_lost_notification_only_delays_the_subscriber(pg_store, pg_database, pg_schema):
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(f'DROP TRIGGER run_events_feed_notify ON "{pg_schema}".run_events')
    threading.Timer(0.3, lambda: pg_store.append(ev("r1", "A"))).start()

    got = collect(pg_store, expected=1, deadline_s=60, poll=0.2)

    assert [e.run_id for e in got] == ["r1"]


@pytest.mark.parametrize("poll", [float("nan"), float("inf"), 0])
def test_subscribe_refuses_a_poll_interval_that_is_not_a_number_of_seconds(store, poll):
    with pytest.raises(InvalidEvent, match="poll_seconds"):
        next(iter(store.subscribe(0, poll_seconds=poll, stop=lambda: True)))


def _listeners(dsn: str) -> set[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND query = 'LISTEN runstate_feed' AND pid <> pg_backend_pid()"
        ).fetchall()
    return {pid for (pid,) in rows}


def _eventually(condition: Any, deadline_s: float = 30.0) -> Any:
    """The first truthy value of condition(), asked until the deadline (the state is another
    process's: there is no clock to drive)."""
    deadline = time.monotonic() + deadline_s
    while not (value := condition()):
        assert time.monotonic() < deadline, "not reached before the deadline"
        time.sleep(0.05)
    return value


def test_a_subscriber_listens_again_after_its_listener_is_terminated(pg_store, pg_database):
    """What a server restart does to the LISTEN connection; the subscriber polls only once an hour
    here, so the event after the restart can only reach it through the new listener."""
    got: list[StoredEvent] = []
    done = threading.Event()
    subscriber = threading.Thread(
        target=lambda: got.extend(pg_store.subscribe(0, poll_seconds=3600, stop=done.is_set))
    )
    subscriber.start()
    try:
        first = _eventually(lambda: _listeners(pg_database))
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (list(first),))

        again = _eventually(lambda: _listeners(pg_database) - first)
        pg_store.append(ev("r1", "AfterRestart"))
        _eventually(lambda: got)
    finally:
        done.set()
        pg_store.append(ev("r1", "Wake", 1))
        subscriber.join(timeout=60)

    assert again and [e.event_type for e in got][:1] == ["AfterRestart"]


def test_a_listener_that_cannot_connect_retries_with_backoff(caplog):
    from runstate.eventstore.pg_feed import FeedListener

    now = [0.0]
    with caplog.at_level("WARNING", logger="runstate.eventstore.postgres"):
        listener = FeedListener("postgresql://postgres@127.0.0.1:1/none", "s", clock=lambda: now[0])
        tries = []
        for at in (0.5, 1.0, 2.5, 3.0, 6.9, 7.0):
            now[0] = at
            listener.wait(0.001)
            tries.append(caplog.text.count("LISTEN unavailable"))

    assert tries == [1, 2, 2, 3, 3, 4]  # after 1, then 2, then 4 seconds


def test_the_run_history_exports_only_a_store_declaring_a_gap_free_feed(store):
    # The export checks the capability, not the class: Postgres declares it; Snowflake's feed can skip a
    # late commit, and the in-memory store, exact as it is, cannot be read through Spark's JDBC source.
    declared = GAP_FREE_FEED in store.capabilities

    if store.backend.name == "postgres":
        assert declared
        check_feed(store)
    else:
        assert not declared
        with pytest.raises(FeedRefused, match=f"not from a {type(store).__name__}"):
            check_feed(store)
