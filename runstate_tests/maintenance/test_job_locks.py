"""A job's table lock follows the job under its fence (issue: a dead attempt's lock blocked the next)."""

from __future__ import annotations

from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.models import CachedTable
from runstate_tests.support.maintenance import run_out_lease


def test_the_next_attempt_takes_over_its_dead_predecessors_lock(store):
    store.cache.replace_table_cache([CachedTable("db", "t")])
    job_id = store.submit("db", "t", ["rewrite_data_files"])
    dead = store.claim("w1", lease_seconds=60)
    assert store.locks.lock_for_claim(dead, ttl_seconds=60)
    run_out_lease(store, job_id)  # the worker died; its lock would still have a minute to live

    second = store.claim("w2", lease_seconds=60)

    assert second.job_id == job_id and second.attempt_count == 2
    assert store.locks.lock_for_claim(second, ttl_seconds=60)  # taken over at once, under the new fence
    assert store.locks.table_lock(TableRef("db", "t"))["holder"] == job_id
    assert not store.locks.lock_for_claim(dead, ttl_seconds=60)  # the old attempt can no longer refresh it
    assert not store.locks.unlock_for_claim(dead)  # nor free it while the new attempt holds the fence
    assert store.locks.table_lock(TableRef("db", "t")) is not None
    assert store.complete(second, "completed") and store.locks.unlock_for_claim(second)
    assert store.locks.table_lock(TableRef("db", "t")) is None


def test_another_jobs_live_lock_is_never_taken(store):
    store.cache.replace_table_cache([CachedTable("db", "t")])
    assert store.acquire_table_lock("db.t", "someone-else", ttl_seconds=60)
    store.submit("db", "t", ["rewrite_data_files"])

    claim = store.claim("w1", lease_seconds=60)

    assert not store.locks.lock_for_claim(claim, ttl_seconds=60)
    assert store.queue.holds_fence(claim)  # so run_job reports TableLocked, not fenced_out
    assert store.locks.table_lock(TableRef("db", "t"))["holder"] == "someone-else"
