"""The contract's archive, restore and resume point, on both backends."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runstate.eventstore import EventType
from runstate_tests.support.events import T0, count_rows, ev, events_table

LATER = T0 + timedelta(days=30)


def archive_table(backend) -> str:
    return "run_events_archive" if backend.name == "postgres" else "RUN_EVENTS_ARCHIVE"


def test_archive_moves_only_old_finished_runs(backend):
    store = backend.make()
    now = T0 + timedelta(days=30)
    store.append_batch("old", [ev("old", EventType.RUN_STARTED), ev("old", EventType.RUN_COMPLETED, 60)])
    store.append_batch(
        "recent",
        [
            ev("recent", EventType.RUN_STARTED, 29 * 86400),
            ev("recent", EventType.RUN_FAILED, 29 * 86400 + 60),
        ],
    )
    store.append(ev("running", EventType.RUN_STARTED))

    moved = store.archive(7, now=now)

    archive = "run_events_archive" if backend.name == "postgres" else "RUN_EVENTS_ARCHIVE"
    assert moved == 2
    assert count_rows(backend, events_table(backend), "old") == 0
    assert count_rows(backend, archive, "old") == 2
    assert len(store.fetch("recent")) == 2 and len(store.fetch("running")) == 1
    assert store.archive(7, now=now) == 0  # idempotent
    assert count_rows(backend, archive, "old") == 2
    assert store.append(ev("old", EventType.RUN_COMPLETED, 60)).idempotent  # keys still known


def test_archived_run_stays_readable_and_restore_moves_it_back(backend):
    store = backend.make(snapshot_interval=2)
    store.append_batch(
        "old",
        [
            ev("old", EventType.RUN_STARTED),
            ev("old", EventType.STEP_STARTED, 1, step_id="a"),
            ev("old", EventType.RUN_COMPLETED, 60),
        ],
    )
    before = store.fetch("old")
    store.archive(7, now=T0 + timedelta(days=30))

    fetched, resumed, projected = store.fetch("old"), store.resume("old"), store.project("old")
    restored = store.restore("old")

    assert [e.event_id for e in fetched] == [e.event_id for e in before]
    assert resumed.run_snapshot("old").status == "COMPLETED" and len(resumed.events) == 3
    assert projected.status == "COMPLETED" and projected.last_event_seq == 3
    assert restored == 3 and store.restore("old") == 0
    assert count_rows(backend, events_table(backend), "old") == 3
    assert [e.event_id for e in store.fetch("old")] == [e.event_id for e in before]
    assert store.archive(7, now=T0 + timedelta(days=30)) == 0  # a restored run is not archived again at once


def test_archive_rejects_bad_arguments(store):
    with pytest.raises(ValueError):
        store.archive(-1)
    with pytest.raises(ValueError):
        store.archive(1, now=T0.replace(tzinfo=None))


def test_max_seq_counts_archived_events(backend):
    """The migration resumes after the target's max_seq: an archived run's events are stored too."""
    store = backend.make()
    store.append_batch(
        "old",
        [
            ev("old", EventType.RUN_STARTED),
            ev("old", EventType.STEP_STARTED, 1, step_id="a"),
            ev("old", EventType.RUN_COMPLETED, 60),
        ],
    )
    store.archive(7, now=LATER)
    archived = store.max_seq("old")
    store.append(ev("old", "Late", 120, key="late"))  # appended after the archive: live again

    assert (archived, store.max_seq("old"), store.max_seq("never-written")) == (3, 4, 0)


def test_restore_of_a_run_never_archived_changes_nothing(backend):
    store = backend.make()
    store.append_batch("live", [ev("live", EventType.RUN_STARTED), ev("live", EventType.RUN_COMPLETED, 60)])
    streams = "run_streams" if backend.name == "postgres" else "RUN_STREAMS"

    restored = store.restore("live")

    assert restored == 0
    # IS NULL in SQL: fakesnow reads a NULL TIMESTAMP_TZ back as 1970-01-01.
    assert backend.sql(f"SELECT restored_at IS NULL FROM {streams} WHERE run_id = %s", ("live",)) == [(True,)]
    assert store.archive(7, now=LATER) == 2  # still archivable at its age (was exempt for 90 days)
