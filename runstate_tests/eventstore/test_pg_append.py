"""The Postgres append: one round trip in the common case, and a wrong guess never stored."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from psycopg import pq

from runstate.eventstore import (
    ConcurrencyConflict,
    EventType,
    InvalidEvent,
    PostgresEventStore,
    RunSnapshot,
    fold,
)
from runstate.eventstore import appender as appender_module
from runstate.eventstore.snapshots import decode_snapshot
from runstate_tests.support.events import ev


def _round_trips(trace: Path) -> int:
    """Client waits in a libpq trace: each run of backend messages after frontend ones."""
    trips, previous = 0, "B"
    for line in trace.read_text().splitlines():
        side = line.split("\t", 1)[0]
        trips += side == "B" and previous == "F"
        previous = side
    return trips


def _traced_appends(store: PostgresEventStore, trace: Path, appends: list) -> None:
    with open(trace, "w") as out:
        with store.datastore.connection() as conn:  # pool_size=1: the connection every append takes
            conn.pgconn.trace(out.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            for run_id, events in appends:
                store.append_batch(run_id, events)
        finally:
            with store.datastore.connection() as conn:
                conn.pgconn.untrace()  # flushes libpq's buffer into the file


def test_an_append_is_one_round_trip_with_or_without_its_snapshot(pg_database, pg_schema, tmp_path):
    store = PostgresEventStore(pg_database, schema=pg_schema, pool_size=1, snapshot_interval=4)
    store.ensure_schema()
    batch = lambda run, start: [ev(run, "Tick", start + i, key=f"{run}-{start + i}") for i in range(2)]  # noqa: E731
    for n in range(12):  # the statements are prepared by now, with and without a snapshot
        store.append_batch("warm", batch("warm", 2 * n))
    appends = [(f"run-{r}", batch(f"run-{r}", 2 * n)) for n in range(4) for r in range(3)]

    _traced_appends(store, tmp_path / "trace", appends)

    assert _round_trips(tmp_path / "trace") == len(appends)
    assert store.metrics.written == 6 + 6  # every second batch crosses a multiple of 4, warm-up included
    store.close()


def test_a_run_written_by_two_stores_keeps_true_snapshots(pg_database, pg_schema):
    """Each store's guess of where the run stands goes stale when the other writes; the database
    refuses the stale guess and the append is made the slow way, so every stored snapshot is the
    projection of the run's events up to its seq."""
    stores = [PostgresEventStore(pg_database, schema=pg_schema, snapshot_interval=5) for _ in range(2)]
    stores[0].ensure_schema()
    for n in range(12):
        events = [ev("shared", EventType.STEP_STARTED, 3 * n + i, step_id=f"s{n}-{i}") for i in range(3)]
        results = stores[n % 2].append_batch("shared", events)
        assert [r.run_seq for r in results] == [3 * n + 1, 3 * n + 2, 3 * n + 3]

    events = stores[0].fetch("shared", limit=100)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        snapshots = conn.execute(
            f'SELECT seq, encoding, payload, checksum FROM "{pg_schema}".run_state_snapshots'
            " WHERE run_id = %s ORDER BY seq",
            ("shared",),
        ).fetchall()
    assert [row[0] for row in snapshots] == [27, 30, 36]  # the latest three of 6, 12, 15, 21, 27, 30, 36
    for seq, encoding, payload, checksum in snapshots:
        expected = fold(RunSnapshot.empty("shared"), [e for e in events if e.run_seq <= seq])
        assert decode_snapshot("shared", seq, encoding, bytes(payload), checksum) == expected.to_dict()
    for store in stores:
        store.close()


def test_a_retried_append_returns_the_stored_seqs_and_writes_nothing(pg_store, pg_database, pg_schema):
    events = [ev("r", "Tick", i, key=f"k{i}") for i in range(3)]
    first = pg_store.append_batch("r", events)

    other = PostgresEventStore(pg_database, schema=pg_schema)  # no hint of the run: guesses it is new
    again = other.append_batch("r", events)
    mixed = pg_store.append_batch("r", [events[1], ev("r", "Tick", 9, key="k9")])

    assert [(r.run_seq, r.idempotent) for r in again] == [(r.run_seq, True) for r in first]
    assert [(r.run_seq, r.idempotent, r.persisted) for r in mixed] == [(2, True, False), (4, False, True)]
    assert [e.run_seq for e in pg_store.fetch("r")] == [1, 2, 3, 4]
    other.close()


def test_a_failure_between_the_insert_and_its_snapshot_writes_neither(pg_database, pg_schema, monkeypatch):
    """The insert leaves before the snapshot is made; an interrupt while it is being made rolls the
    insert back, and the connection goes back to the pool clean."""
    store = PostgresEventStore(pg_database, schema=pg_schema, pool_size=1, snapshot_interval=2)
    store.ensure_schema()
    batch = [ev("r", "Tick", i, key=f"k{i}") for i in range(2)]

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(appender_module, "encode_snapshot", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.append_batch("r", batch)
    monkeypatch.undo()

    assert store.fetch("r") == []
    assert [r.run_seq for r in store.append_batch("r", batch)] == [1, 2]
    assert store.metrics.written == 1 and store.resume("r").snapshot_seq == 2
    store.close()


def test_a_retried_batch_that_crosses_a_snapshot_point_is_refused_whole_then_found(pg_database, pg_schema):
    """The insert fails on a stored key with the snapshot already sent behind it in the same flight:
    the transaction rolls back, the connection is clean again, and the slow way finds the stored seqs."""
    writer = PostgresEventStore(pg_database, schema=pg_schema, pool_size=1, snapshot_interval=2)
    writer.ensure_schema()
    batch = [ev("r", "Tick", i, key=f"k{i}") for i in range(2)]
    writer.append_batch("r", batch)
    retrier = PostgresEventStore(pg_database, schema=pg_schema, pool_size=1, snapshot_interval=2)

    again = retrier.append_batch("r", batch)  # no hint of the run: guessed new, so a snapshot is due
    after = retrier.append_batch("r", [ev("r", "Tick", 2, key="k2"), ev("r", "Tick", 3, key="k3")])

    assert [(r.run_seq, r.idempotent) for r in again] == [(1, True), (2, True)]
    assert [r.run_seq for r in after] == [3, 4] and retrier.resume("r").snapshot_seq == 4
    assert writer.metrics.written + retrier.metrics.written == 2
    writer.close()
    retrier.close()


# A batch of HEAD_AHEAD_FROM events or more sends its first third before the rest is validated.
LARGE = appender_module.HEAD_AHEAD_FROM + 8


def _large(run_id: str, start: int = 0) -> list:
    return [ev(run_id, "Tick", start + i, key=f"{run_id}-{start + i}") for i in range(LARGE)]


def test_a_bad_event_after_the_head_left_rolls_the_head_back(pg_store):
    batch = _large("r")
    batch[-1] = ev("r", "Tick\x1b[31m", LARGE - 1, key="bad")

    with pytest.raises(InvalidEvent) as raised:
        pg_store.append_batch("r", batch)

    assert (raised.value.field, raised.value.index) == ("event_type", LARGE - 1)
    assert pg_store.fetch("r") == []
    assert [r.run_seq for r in pg_store.append_batch("r", _large("r"))] == list(range(1, LARGE + 1))


@pytest.mark.parametrize("interval", [LARGE, 10_000], ids=["a-snapshot-every-batch", "no-snapshot"])
def test_large_batches_from_two_stores_take_the_runs_true_seqs(pg_database, pg_schema, interval):
    """Each store's hint of the run is stale when it writes: its head takes the stream row's lock and
    the run's true last seq; a snapshot made for the stale position is refused with the whole flight,
    and the slow way writes the batch and the true snapshot."""
    stores = [PostgresEventStore(pg_database, schema=pg_schema, snapshot_interval=interval) for _ in range(2)]
    stores[0].ensure_schema()
    for n in range(4):
        results = stores[n % 2].append_batch("shared", _large("shared", n * LARGE))
        assert [r.run_seq for r in results] == list(range(n * LARGE + 1, (n + 1) * LARGE + 1))

    events = stores[0].fetch("shared", limit=1000)
    assert [e.run_seq for e in events] == list(range(1, 4 * LARGE + 1))
    for store in stores:
        resume = store.resume("shared")
        assert resume.snapshot_seq == (4 * LARGE if interval == LARGE else 0)
        if interval == LARGE:
            assert resume.state == fold(RunSnapshot.empty("shared"), events).to_dict()
        store.close()


def test_a_large_batch_repeating_keys_across_its_head_and_rest_stores_each_once(pg_store):
    batch = _large("r")
    batch[-1] = ev("r", "Tick", 99, key=batch[0].idempotency_key)  # repeats the head's first key
    again = pg_store.append_batch("r", batch)
    retried = pg_store.append_batch("r", batch)

    assert [r.run_seq for r in again] == [*range(1, LARGE), 1]
    assert [(r.run_seq, r.idempotent) for r in retried] == [(r.run_seq, True) for r in again]
    assert len(pg_store.fetch("r", limit=1000)) == LARGE - 1


def test_writers_racing_large_batches_into_one_run_store_every_event_once_in_order(pg_database, pg_schema):
    """Four threads, each its own store and connection, append large batches to one run at once: the
    heads serialise on the stream row's lock, so the seqs are dense and each batch's are consecutive."""
    PostgresEventStore(pg_database, schema=pg_schema).ensure_schema()

    def writer(w: int) -> list[list[int]]:
        store = PostgresEventStore(pg_database, schema=pg_schema, pool_size=1)
        try:
            return [
                [r.run_seq for r in store.append_batch("race", _large("race", 1000 * w + LARGE * b))]
                for b in range(3)
            ]
        finally:
            store.close()

    with ThreadPoolExecutor(4) as pool:
        seqs = [batch for batches in pool.map(writer, range(4)) for batch in batches]

    assert sorted(s for batch in seqs for s in batch) == list(range(1, 12 * LARGE + 1))
    assert all(batch == list(range(batch[0], batch[0] + LARGE)) for batch in seqs)


def test_a_refused_flight_logs_no_driver_warning(pg_database, pg_schema, caplog):
    """A retried large batch from a store that has not seen the run is refused in its flight (its head's
    keys are stored, its snapshot already queued): the refusal is expected, so psycopg must not warn
    about the aborted pipeline on the way out."""
    stores = [PostgresEventStore(pg_database, schema=pg_schema, snapshot_interval=LARGE) for _ in range(2)]
    stores[0].ensure_schema()
    stores[0].append_batch("r", _large("r"))
    with caplog.at_level(logging.WARNING):
        again = stores[1].append_batch("r", _large("r"))

    assert all(r.idempotent for r in again)
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")]
    for store in stores:
        store.close()


def test_appends_after_a_refused_expected_seq_keep_working_on_the_same_connection(pg_database, pg_schema):
    """A conflict rolls the slow path's transaction back, and psycopg forgets its prepared statements on
    a rollback. Had the flight sent a ROLLBACK statement, psycopg would have deallocated them only after
    the next append prepared its own again, and the append after that failed: `prepared statement
    "_pg3_1" does not exist` (12 racing writers hit it about one run in ten)."""
    store = PostgresEventStore(pg_database, schema=pg_schema, pool_size=1)  # one connection throughout
    store.ensure_schema()
    store.append(ev("r", "RunStarted", 0, key="k0"))  # the one-flight statement is prepared
    with pytest.raises(ConcurrencyConflict):
        store.append(ev("r", "Tick", 1, key="k1"), expected_last_seq=0)

    seqs = [store.append(ev("r", "Tick", i, key=f"k{i}")).run_seq for i in range(1, 4)]

    assert seqs == [2, 3, 4]
    store.close()
