"""runstate.defs.pool: giving a pool its limit is safe to race, which Dagster's own call is not (it reads
the limit's row, then inserts it: two processes doing so at once both insert)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dagster as dg

from runstate.defs.pool import set_pool_slots

REPO_ROOT = Path(__file__).resolve().parents[2]
RACERS = 4
POOLS = 12


def test_racers_giving_new_pools_their_limit_all_succeed_and_each_pool_has_it(fresh_database, monkeypatch):
    monkeypatch.setenv("DAGSTER_PG_URL", fresh_database.replace("postgresql://", "postgresql+psycopg2://", 1))
    # One instance (its own storage and connections) per racer, as two `services up` or two runs have.
    instances = [dg.DagsterInstance.from_config(str(REPO_ROOT)) for _ in range(RACERS)]
    barriers = [threading.Barrier(RACERS) for _ in range(POOLS)]

    def racer(instance: dg.DagsterInstance) -> None:
        try:
            for pool, barrier in enumerate(barriers):
                barrier.wait(timeout=60)
                set_pool_slots(instance.event_log_storage, f"race_{pool}", 3)
        except BaseException:
            for barrier in barriers:  # the others stop waiting for this racer
                barrier.abort()
            raise

    try:
        with ThreadPoolExecutor(RACERS) as threads:
            errors = [done.exception() for done in [threads.submit(racer, i) for i in instances]]
        # What a racer raised, not the broken barriers of those it stopped.
        assert not [e for e in errors if e and not isinstance(e, threading.BrokenBarrierError)], errors
        assert errors == [None] * RACERS
        infos = [instances[0].event_log_storage.get_concurrency_info(f"race_{pool}") for pool in range(POOLS)]
        assert [(info.limit, len(info.claimed_slots)) for info in infos] == [(3, 0)] * POOLS
        assert [info.slot_count for info in infos] == [3] * POOLS  # not 3 per racer
    finally:
        for instance in instances:
            instance.dispose()
