"""Optimistic concurrency (expected_last_seq) on both backends, raced by 12 real processes."""

from __future__ import annotations

from typing import Any

import pytest

from runstate.eventstore import (
    ConcurrencyConflict,
    PostgresEventStore,
    SnowflakeEventStore,
)
from runstate_tests.support.events import ev
from runstate_tests.support.races import race_outcomes, racing_processes

WRITERS = 12


def test_expected_last_seq_wins_only_at_that_seq(store):
    first = store.append(ev("r1", "RunStarted"), expected_last_seq=0)

    with pytest.raises(ConcurrencyConflict) as caught:
        store.append(ev("r1", "StepStarted", step_id="a"), expected_last_seq=0)
    second = store.append_batch("r1", [ev("r1", "StepStarted", step_id="a")], expected_last_seq=1)

    assert (first.run_seq, second[0].run_seq) == (1, 2)
    conflict = caught.value
    assert (conflict.run_id, conflict.expected, conflict.actual) == ("r1", 0, 1)
    assert "expected last seq 0" in str(conflict) and "at seq 1" in str(conflict)


def test_a_pure_retry_returns_the_stored_results(store):
    batch = [ev("r1", "RunStarted"), ev("r1", "StepStarted", step_id="a")]
    first = store.append_batch("r1", batch, expected_last_seq=0)

    again = store.append_batch("r1", batch, expected_last_seq=0)

    assert [r.run_seq for r in again] == [r.run_seq for r in first] == [1, 2]
    assert all(r.idempotent and not r.persisted for r in again)
    with pytest.raises(ConcurrencyConflict):  # half old, half new: not a pure retry
        store.append_batch("r1", [batch[0], ev("r1", "StepCompleted", step_id="a")], expected_last_seq=0)
    assert len(store.fetch("r1")) == 2


def test_bad_expected_last_seq_is_invalid_input(store):
    with pytest.raises(ValueError, match="expected_last_seq"):
        store.append(ev("r1", "RunStarted"), expected_last_seq=-1)


def _race(kind: str, config: dict[str, Any], writer: int, rounds: int, barrier: Any, results: Any) -> None:
    """One writer process: each round, append its own event expecting the run at seq `round`."""
    if kind == "postgres":
        store: Any = PostgresEventStore(config["dsn"], schema=config["schema"], pool_size=1)
    else:
        store = SnowflakeEventStore(connect_kwargs=config["kwargs"], schema=config["schema"], pool_size=1)
    try:
        for round_no in range(rounds):
            barrier.wait(timeout=300)
            event = ev("race", "Tick", round_no, key=f"w{writer}-r{round_no}")
            try:
                (result,) = store.append_batch("race", [event], expected_last_seq=round_no)
                results.put((round_no, writer, "won", result.run_seq))
            except ConcurrencyConflict as exc:
                results.put((round_no, writer, "lost" if exc.actual is not None else f"gave up: {exc}", 0))
            barrier.wait(timeout=300)  # every writer has tried before the next round starts
    finally:
        store.close()


def test_twelve_processes_race_and_exactly_one_wins_each_round(backend, request):
    if backend.name == "memory":
        pytest.skip("the in-memory backend's tables are one process's")
    rounds = 4 if backend.name == "postgres" else 2
    store = backend.make()  # migrations applied once, before the race
    if backend.name == "postgres":
        config = {
            "dsn": request.getfixturevalue("pg_database"),
            "schema": request.getfixturevalue("pg_schema"),
        }
    else:
        kwargs, schema = request.getfixturevalue("snowflake_schema")
        config = {"kwargs": kwargs, "schema": schema}
    context = racing_processes()
    barrier, results = context.Barrier(WRITERS), context.Queue()
    workers = [
        context.Process(target=_race, args=(backend.name, config, w, rounds, barrier, results))
        for w in range(WRITERS)
    ]
    for worker in workers:
        worker.start()
    outcomes = race_outcomes(results, workers, WRITERS * rounds)
    for worker in workers:
        worker.join(timeout=120)

    assert all(worker.exitcode == 0 for worker in workers)
    for round_no in range(rounds):
        this_round = [o for o in outcomes if o[0] == round_no]
        assert [o[2] for o in this_round].count("won") == 1, this_round
        assert [o[2] for o in this_round].count("lost") == WRITERS - 1, this_round
        assert [o[3] for o in this_round if o[2] == "won"] == [round_no + 1]
    stored = store.fetch("race")
    winners = {(o[0], o[1]) for o in outcomes if o[2] == "won"}
    assert [e.run_seq for e in stored] == list(range(1, rounds + 1))
    assert {e.idempotency_key for e in stored} == {f"w{w}-r{r}" for r, w in winners}
