"""One contract, both backends: every test here runs on Postgres and on Snowflake (fakesnow)."""

from __future__ import annotations

import logging
import random
import threading
from collections import defaultdict
from datetime import timedelta

import pytest

from runstate.eventstore import EventType, InvalidEvent, NewEvent, RunSnapshot, fold
from runstate_tests.support.events import T0, Backend, count_rows, ev, events_table

# -- append, duplicates, fetch ------------------------------------------------------------------


def test_append_assigns_increasing_run_seq(store):
    results = [store.append(ev("r1", EventType.STEP_STARTED, i, step_id=f"s{i}")) for i in range(3)]

    assert [r.run_seq for r in results] == [1, 2, 3]
    assert all(r.persisted and not r.idempotent for r in results)


def test_runs_have_independent_sequences(store):
    store.append(ev("a", EventType.RUN_STARTED))
    result = store.append(ev("b", EventType.RUN_STARTED))

    assert result.run_seq == 1


def test_duplicate_returns_existing_run_seq(store, backend):
    first = store.append(ev("r1", EventType.RUN_STARTED))
    store.append(ev("r1", EventType.STEP_STARTED, step_id="a"))
    again = store.append(ev("r1", EventType.RUN_STARTED, 5))

    assert (again.run_seq, again.idempotent, again.persisted) == (first.run_seq, True, False)
    assert count_rows(backend, events_table(backend), "r1") == 2


def test_duplicate_inside_one_batch_is_written_once(store):
    results = store.append_batch(
        "r1", [ev("r1", "X", key="k1"), ev("r1", "Y", key="k2"), ev("r1", "X", key="k1")]
    )

    assert [(r.run_seq, r.idempotent) for r in results] == [(1, False), (2, False), (1, True)]
    assert len(store.fetch("r1")) == 2


def test_fetch_round_trips_every_field(store):
    event = NewEvent(
        run_id="r1",
        event_type=EventType.STEP_COMPLETED,
        emitted_at=T0,
        data={"rows": 3, "tags": ["a", "é"]},
        step_id="load",
        engine_attempt_id="2",
        logical_attempt_id="1",
        plan_version="v7",
        event_id="7d3c9a1e-5b7e-4a6f-9f3a-1b2c3d4e5f60",
        caused_by_signal_id="11111111-2222-3333-4444-555555555555",
        parent_event_id="aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        adapter_version="dagster-1.13",
        engine_run_ref={"dagsterRunId": "abc"},
    )
    store.append(event)

    (got,) = store.fetch("r1")
    for name in (
        "run_id",
        "event_type",
        "data",
        "step_id",
        "engine_attempt_id",
        "logical_attempt_id",
        "plan_version",
        "event_id",
        "idempotency_key",
        "caused_by_signal_id",
        "parent_event_id",
        "adapter_version",
        "engine_run_ref",
    ):
        assert getattr(got, name) == getattr(event, name), name
    assert got.emitted_at == T0
    assert got.run_seq == 1 and got.persisted_at is not None


def test_fetch_pages_with_the_watermark(store):
    store.append_batch("r1", [ev("r1", "Tick", i, key=f"k{i}") for i in range(25)])

    pages, after = [], 0
    while page := store.fetch("r1", after_seq=after, limit=10):
        pages.append([e.run_seq for e in page])
        after = page[-1].run_seq

    assert [len(p) for p in pages] == [10, 10, 5]
    assert sum(pages, []) == list(range(1, 26))


def test_unknown_event_types_are_stored(store):
    store.append(ev("r1", "VendorSpecificThing", data={"a": 1}))

    assert store.fetch("r1")[0].event_type == "VendorSpecificThing"
    assert store.project("r1").status == "PENDING"


# -- validation and batch atomicity ---------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, field",
    [
        (lambda: ev("r1", ""), "event_type"),
        (lambda: NewEvent("r1", "X", T0.replace(tzinfo=None)), "emitted_at"),
        (lambda: ev("r1", "X", data={"s": {1}}), "data"),
        (lambda: ev("r1", "X", data={"blob": "x" * 5000}), "data"),
        (lambda: ev("r1", "X", event_id="nope"), "event_id"),
        (lambda: ev("r1", "X", parent_event_id="123"), "parent_event_id"),
    ],
)
def test_one_bad_event_rejects_the_whole_batch(backend, bad, field):
    store = backend.make(max_event_bytes=4096)
    store.append(ev("r1", EventType.RUN_STARTED))
    batch = [ev("r1", "A", key="a"), ev("r1", "B", key="b"), bad(), ev("r1", "C", key="c")]

    with pytest.raises(InvalidEvent) as caught:
        store.append_batch("r1", batch)

    assert caught.value.field == field
    assert caught.value.index == 2
    assert [e.event_type for e in store.fetch("r1")] == [EventType.RUN_STARTED]
    assert store.append(ev("r1", "Next")).run_seq == 2


@pytest.mark.parametrize("run_id", ["", "r" * 257])
def test_bad_run_id_is_rejected(store, run_id):
    with pytest.raises(InvalidEvent) as caught:
        store.append(ev(run_id, "X"))

    assert caught.value.field == "run_id"


def test_batch_for_another_run_is_rejected(store):
    with pytest.raises(InvalidEvent, match="batch is for run"):
        store.append_batch("r1", [ev("r1", "A"), ev("r2", "B")])

    assert store.fetch("r1") == []


def test_unserialisable_state_is_rejected_before_writing(store):
    with pytest.raises(InvalidEvent) as caught:
        store.append_batch("r1", [ev("r1", "A")], state={"when": object()})

    assert caught.value.field == "state"
    assert store.fetch("r1") == []


# -- concurrency --------------------------------------------------------------------------------


def _hammer(store, threads: int, per_thread: int, run_for: callable) -> dict[int, list[tuple[str, str, int]]]:
    """Each thread appends its own keys in order, re-sending a random earlier key every 5th time."""
    results: dict[int, list[tuple[str, str, int]]] = defaultdict(list)
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        rng = random.Random(t)
        try:
            start.wait()
            for i in range(per_thread):
                run_id = run_for(t, i)
                key = f"t{t}-{i}"
                res = store.append(ev(run_id, "Tick", i, key=key, data={"t": t, "i": i}))
                assert res.persisted and not res.idempotent
                results[t].append((run_id, key, res.run_seq))
                if i % 5 == 4:
                    old_run, old_key, old_seq = rng.choice(results[t])
                    again = store.append(ev(old_run, "Tick", 0, key=old_key))
                    assert (again.run_seq, again.idempotent, again.persisted) == (old_seq, True, False)
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors[:3]
    return results


def _check_store_against(store, results, run_ids) -> None:
    expected = {(run_id, key): seq for rows in results.values() for run_id, key, seq in rows}
    stored = {}
    for run_id in run_ids:
        events = store.fetch(run_id, limit=100_000)
        seqs = [e.run_seq for e in events]
        assert seqs == sorted(set(seqs)), f"{run_id}: duplicate or unordered run_seq"
        keys = [e.idempotency_key for e in events]
        assert len(keys) == len(set(keys)), f"{run_id}: an idempotency key is stored twice"
        stored.update({(run_id, e.idempotency_key): e.run_seq for e in events})
    assert stored == expected  # nothing lost, nothing extra, every caller got the stored seq
    for rows in results.values():  # one writer's appends to a run get increasing seqs
        per_run = defaultdict(list)
        for run_id, _, seq in rows:
            per_run[run_id].append(seq)
        assert all(seqs == sorted(seqs) for seqs in per_run.values())


def test_concurrent_appends_to_one_run(backend):
    store = backend.make()
    per_thread = 500 // backend.scale

    results = _hammer(store, 8, per_thread, lambda t, i: "hot")

    _check_store_against(store, results, ["hot"])
    assert len(store.fetch("hot", limit=100_000)) == 8 * per_thread


def test_concurrent_appends_to_many_runs(backend):
    store = backend.make()
    per_thread = 500 // backend.scale

    results = _hammer(store, 8, per_thread, lambda t, i: f"run-{(t * 7 + i) % 16}")

    _check_store_against(store, results, [f"run-{n}" for n in range(16)])


# -- projection ---------------------------------------------------------------------------------


def _story(run_id: str) -> list[NewEvent]:
    return [
        ev(run_id, EventType.RUN_STARTED, 0),
        ev(run_id, EventType.STEP_STARTED, 1, step_id="extract", logical_attempt_id="1"),
        ev(
            run_id,
            EventType.STEP_FAILED,
            2,
            step_id="extract",
            logical_attempt_id="1",
            data={"error": "boom"},
        ),
        ev(run_id, EventType.STEP_RETRYING, 3, step_id="extract", logical_attempt_id="1"),
        ev(run_id, EventType.STEP_STARTED, 4, step_id="extract", logical_attempt_id="2"),
        ev(run_id, EventType.STEP_COMPLETED, 5, step_id="extract", logical_attempt_id="2"),
        ev(run_id, EventType.ARTIFACT_EMITTED, 6, step_id="extract", data={"uri": "s3://x/y"}),
        ev(run_id, EventType.RUN_COMPLETED, 7),
    ]


def test_project_is_incremental_and_versioned(store):
    story = _story("r1")
    store.append_batch("r1", story[:4])
    first = store.project("r1")
    store.append_batch("r1", story[4:])
    second = store.project("r1")
    unchanged = store.project("r1")

    assert (first.status, first.last_event_seq, first.version) == ("RUNNING", 4, 1)
    assert first.steps["extract"].status == "RETRYING"
    assert (second.status, second.last_event_seq, second.version) == ("COMPLETED", 8, 2)
    assert second.steps["extract"].attempts == 2
    assert unchanged == second


def test_rebuild_from_scratch_is_identical(store):
    story = _story("r1")
    for event in story:
        store.append(event)
        store.project("r1")
    incremental = store.project("r1")

    rebuilt = store.rebuild("r1")

    assert rebuilt == incremental  # same state, and the version did not move
    assert rebuilt.same_state(fold(RunSnapshot.empty("r1"), store.fetch("r1")))


def test_concurrent_projectors_agree(store):
    store.append_batch("r1", _story("r1"))
    seen = []

    def project():
        seen.append(store.project("r1"))

    threads = [threading.Thread(target=project) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    final = store.project("r1")
    assert final.version == 1
    assert all(s.same_state(final) for s in seen)


def test_project_of_unknown_run_is_pending(store):
    snap = store.project("nobody")

    assert (snap.status, snap.last_event_seq, snap.version) == ("PENDING", 0, 0)


def test_stale_runs_lists_runs_with_new_events(store):
    store.append(ev("a", EventType.RUN_STARTED))
    store.append(ev("b", EventType.RUN_STARTED))
    store.project("a")

    assert store.stale_runs() == ["b"]
    store.append(ev("a", EventType.RUN_COMPLETED))
    assert store.stale_runs() == ["a", "b"]


def test_runs_started_between_uses_the_run_started_day(store):
    store.append(ev("early", EventType.RUN_STARTED, 0))
    store.append(ev("late", EventType.RUN_STARTED, 86_400))

    assert store.runs_started_between(T0 - timedelta(hours=12), T0 + timedelta(hours=12)) == ["early"]


# -- periodic snapshots and resume --------------------------------------------------------------


def test_snapshot_written_when_count_crosses_the_interval(backend):
    store = backend.make(snapshot_interval=10)
    for start in range(0, 25, 7):
        store.append_batch("r1", [ev("r1", "Tick", i, key=f"k{i}") for i in range(start, min(start + 7, 25))])

    resume = store.resume("r1")

    # counts went 7, 14, 21, 25: the batches ending at 14 and 21 crossed 10 and 20
    assert (resume.snapshot_seq, resume.kind) == (21, "projection")
    assert [e.run_seq for e in resume.events] == [22, 23, 24, 25]
    assert store.metrics.written == 2


def test_resume_equals_full_replay(backend):
    store = backend.make(snapshot_interval=3)
    store.append_batch("r1", _story("r1")[:5])
    store.append_batch("r1", _story("r1")[5:])

    resume = store.resume("r1")

    assert resume.snapshot_seq > 0
    assert resume.run_snapshot("r1").same_state(store.rebuild("r1"))


def test_snapshot_holds_the_callers_state(backend):
    store = backend.make(snapshot_interval=2)
    store.append_batch(
        "r1", [ev("r1", "A", key="a"), ev("r1", "B", key="b")], state={"cursor": 2, "done": ["a"]}
    )

    resume = store.resume("r1")

    assert (resume.state, resume.snapshot_seq, resume.kind, resume.events) == (
        {"cursor": 2, "done": ["a"]},
        2,
        "state",
        [],
    )


def test_signal_waiting_takes_a_snapshot(store):
    store.append(ev("r1", EventType.RUN_STARTED))
    store.append(ev("r1", EventType.SIGNAL_WAITING, 1))

    resume = store.resume("r1")

    assert resume.snapshot_seq == 2
    assert resume.state["status"] == "WAITING"


def test_manual_checkpoint(store):
    store.append_batch("r1", _story("r1")[:3])

    seq = store.checkpoint("r1", state={"note": "after an expensive step"})

    assert seq == 3
    assert store.resume("r1").state == {"note": "after an expensive step"}
    assert store.checkpoint("nobody") == 0


def test_only_the_latest_snapshots_are_kept(backend):
    store = backend.make(snapshot_interval=1, keep_snapshots=3)
    for i in range(6):
        store.append(ev("r1", "Tick", i, key=f"k{i}"))

    table = "run_state_snapshots" if backend.name == "postgres" else "RUN_STATE_SNAPSHOTS"
    seqs = sorted(r[0] for r in backend.sql(f"SELECT seq FROM {table} WHERE run_id = %s", ("r1",)))
    assert seqs == [4, 5, 6]


def _corrupt(backend: Backend, run_id: str, seq: int) -> None:
    if backend.name == "postgres":
        backend.sql(
            "UPDATE run_state_snapshots SET payload = %s WHERE run_id = %s AND seq = %s",
            (b'{"status":"tampered"}', run_id, seq),
        )
    else:
        backend.sql(
            "UPDATE RUN_STATE_SNAPSHOTS SET PAYLOAD = %s WHERE RUN_ID = %s AND SEQ = %s",
            ("eyJzdGF0dXMiOiJ0YW1wZXJlZCJ9", run_id, seq),
        )


def test_corrupt_snapshot_falls_back_to_an_older_one(backend, caplog):
    store = backend.make(snapshot_interval=2)
    store.append_batch("r1", _story("r1")[:2])
    store.append_batch("r1", _story("r1")[2:4])
    _corrupt(backend, "r1", 4)

    with caplog.at_level(logging.WARNING, logger="runstate.eventstore.snapshots"):
        resume = store.resume("r1")

    assert (resume.snapshot_seq, resume.fallbacks) == (2, 1)
    assert [e.run_seq for e in resume.events] == [3, 4]
    assert "checksum mismatch" in caplog.text
    assert store.metrics.corrupt_fallbacks == 1
    assert resume.run_snapshot("r1").same_state(store.rebuild("r1"))


def test_all_snapshots_corrupt_means_full_replay(backend):
    store = backend.make(snapshot_interval=2)
    store.append_batch("r1", _story("r1")[:2])
    store.append_batch("r1", _story("r1")[2:4])
    _corrupt(backend, "r1", 2)
    _corrupt(backend, "r1", 4)

    resume = store.resume("r1")

    assert (resume.snapshot_seq, resume.kind, resume.fallbacks, len(resume.events)) == (0, "none", 2, 4)
    assert store.metrics.full_replays == 1


def test_large_state_is_compressed_with_a_warning(backend, caplog):
    store = backend.make(snapshot_interval=1)
    state = {"blob": [f"row {i} with some padding text" for i in range(6000)]}

    with caplog.at_level(logging.WARNING, logger="runstate.eventstore.snapshots"):
        store.append_batch("r1", [ev("r1", "A")], state=state)

    assert "compressing" in caplog.text
    assert store.metrics.compressed == 1 and store.metrics.large_warnings == 1
    assert store.metrics.bytes_written < store.metrics.raw_bytes_written / 5
    assert store.resume("r1").state == state


# -- archival -----------------------------------------------------------------------------------


def test_stale_runs_with_start_and_project_runs(store):
    store.append_batch("a", [ev("a", "Prelude", 5), ev("a", EventType.RUN_STARTED, 10)])
    store.append(ev("b", "Prelude", 20))
    store.project("b")
    store.append(ev("b", EventType.STEP_STARTED, 30, step_id="x"))
    store.append(ev("c", "Prelude", 40))

    stale = store.stale_runs_with_start()

    assert stale == [
        ("a", T0 + timedelta(seconds=10), 2),
        ("b", T0 + timedelta(seconds=20), 2),
        ("c", T0 + timedelta(seconds=40), 1),
    ]
    report = store.project_runs([r for r, _, _ in stale])
    assert (report.runs_projected, report.runs_changed, report.events_applied) == (3, 3, 4)
    assert store.stale_runs_with_start() == []
    rebuilt = store.project_runs(["a", "b"], rebuild=True)
    assert (rebuilt.runs_projected, rebuilt.runs_changed, rebuilt.events_applied) == (2, 0, 4)


def test_missing_snapshot_is_counted_and_metrics_credit_replay_saved(backend, caplog):
    store = backend.make(snapshot_interval=100)
    store.append_batch("r1", [ev("r1", "Tick", i, key=f"k{i}") for i in range(99)])
    store.append(ev("r1", "Tick", 99, key="k99"))  # crosses 100: a snapshot at seq 100
    table = "run_state_snapshots" if backend.name == "postgres" else "RUN_STATE_SNAPSHOTS"
    backend.sql(f"DELETE FROM {table} WHERE run_id = %s", ("r1",))

    with caplog.at_level(logging.WARNING, logger="runstate.eventstore.snapshots"):
        replay = store.resume("r1")
    store.checkpoint("r1")
    quick = store.resume("r1")

    assert (replay.snapshot_seq, len(replay.events)) == (0, 100)
    assert "no state snapshot" in caplog.text
    assert (store.metrics.missing, store.metrics.full_replays) == (1, 1)
    assert (quick.snapshot_seq, quick.events) == (100, [])
    assert store.metrics.events_skipped == 100 and store.metrics.replay_seconds_saved > 0
