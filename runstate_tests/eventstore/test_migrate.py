"""Postgres -> Snowflake (fakesnow) migration: batched, resumable, idempotent, verified."""

from __future__ import annotations

import pytest

from runstate.eventstore import EventType, InvalidEvent, StoredEvent, migrate_events, verify_migration
from runstate.eventstore.migrate import run_digest
from runstate_tests.support.events import ev


def _fill(pg_store) -> int:
    total = 0
    for n in range(3):
        run_id = f"run-{n}"
        events = [ev(run_id, EventType.RUN_STARTED)] + [
            ev(run_id, EventType.STEP_COMPLETED, i, step_id=f"s{i}", data={"i": i, "name": "é"})
            for i in range(1, 12 + n)
        ]
        pg_store.append_batch(run_id, events)
        total += len(events)
    pg_store.append(ev("run-0", EventType.RUN_STARTED))  # a duplicate: not a new event
    return total


def test_migration_copies_and_verifies(pg_store, sf_store):
    total = _fill(pg_store)
    seen: list[int] = []

    report = migrate_events(pg_store, sf_store, batch_size=5, progress=seen.append)

    assert (report.runs, report.events_read, report.events_written, report.verified) == (
        3,
        total,
        total,
        True,
    )
    assert sum(seen) == total and max(seen) == 5
    for n in range(3):
        assert run_digest(pg_store, f"run-{n}") == run_digest(sf_store, f"run-{n}")
    src, dst = pg_store.fetch("run-1"), sf_store.fetch("run-1")
    assert [(e.run_seq, e.event_id, e.data, e.emitted_at) for e in src] == [
        (e.run_seq, e.event_id, e.data, e.emitted_at) for e in dst
    ]


def test_migration_resumes_after_an_interruption(pg_store, sf_store):
    total = _fill(pg_store)
    copied: list[int] = []

    def fail_on_third_batch(n: int) -> None:
        copied.append(n)
        if len(copied) == 3:
            raise KeyboardInterrupt("operator pressed ^C")

    with pytest.raises(KeyboardInterrupt):
        migrate_events(pg_store, sf_store, batch_size=5, progress=fail_on_third_batch)
    report = migrate_events(pg_store, sf_store, batch_size=5)

    assert report.verified
    assert report.events_written == total - sum(copied)  # batches done before ^C are not copied again
    assert migrate_events(pg_store, sf_store, batch_size=5).events_written == 0
    assert verify_migration(pg_store, sf_store) == []


def test_migration_keeps_idempotency_in_the_target(pg_store, sf_store):
    _fill(pg_store)
    migrate_events(pg_store, sf_store)

    again = sf_store.append(
        ev("run-2", EventType.STEP_COMPLETED, 3, step_id="s3", data={"i": 3, "name": "é"})
    )
    fresh = sf_store.append(ev("run-2", EventType.RUN_COMPLETED, 99))

    assert again.idempotent and again.run_seq == 4
    assert (fresh.run_seq, fresh.persisted) == (15, True)


def test_verification_reports_a_difference(pg_store, sf_store):
    _fill(pg_store)
    migrate_events(pg_store, sf_store)
    pg_store.append(ev("run-1", "LateEvent"))

    problems = verify_migration(pg_store, sf_store)

    assert problems == ["run 'run-1': 14 events in the source, 13 in the target"]


def _imported(run_id: str, seq: int, key: str) -> StoredEvent:
    event = ev(run_id, EventType.STEP_COMPLETED, seq, step_id=f"s{seq}", idempotency_key=key)
    return StoredEvent(**{**event.__dict__, "run_seq": seq, "persisted_at": event.emitted_at})


@pytest.mark.parametrize(
    ("batch", "field"),
    [
        ([("k1", 1), ("k1", 2)], "idempotency_key"),  # one key, two seqs
        ([("k1", 1), ("k2", 1)], "run_seq"),  # one seq, two keys
    ],
    ids=["key-twice", "seq-twice"],
)
def test_an_import_batch_that_gives_a_key_two_seqs_or_a_seq_two_keys_is_refused_and_writes_nothing(
    pg_store, batch, field
):
    events = [_imported("twice", seq, key) for key, seq in batch]

    with pytest.raises(InvalidEvent) as refused:
        pg_store.import_events(events)

    assert refused.value.field == field and "nothing was written" in str(refused.value)
    assert pg_store.fetch("twice") == []


def test_the_same_event_twice_in_an_import_batch_is_one_event(pg_store):
    event = _imported("once", 1, "k1")

    assert pg_store.import_events([event, event]) == 1
    assert [e.run_seq for e in pg_store.fetch("once")] == [1]
