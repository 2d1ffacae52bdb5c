"""A flush shard's lease on the real WAL table (moto): taken once, renewed only by its holder, handed to a
registered successor with a new generation, lost on expiry or when its holder is found dead."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from runstate.wal import WalInputError
from runstate.wal.lease import ShardLease


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def lease_of(wal, clock: Clock | None = None, shard: int = 0, shards: int = 2) -> ShardLease:
    return ShardLease(wal.wal_table(), shard, shards, ttl_s=10.0, clock=clock or Clock())


def test_a_free_lease_is_taken_once_and_a_held_one_is_refused(wal):
    lease = lease_of(wal)

    first = lease.acquire("run-a")

    assert first is not None and first.holder == "run-a" and first.generation == 1
    assert lease.acquire("run-b") is None
    assert lease.acquire("run-a") == first  # its own lease, unchanged


def test_racing_takers_leave_exactly_one_holder(wal):
    lease = lease_of(wal)

    with ThreadPoolExecutor(8) as pool:
        taken = list(pool.map(lease.acquire, [f"run-{i}" for i in range(8)]))

    winners = [state.holder for state in taken if state is not None]
    assert len(winners) == 1 and lease.read().holder == winners[0] and lease.read().generation == 1


def test_an_expired_lease_goes_to_the_next_taker_and_its_old_holder_can_no_longer_renew(wal):
    clock = Clock()
    lease = lease_of(wal, clock)
    old = lease.acquire("run-a")
    clock.now += 9
    old = lease.renew(old)
    assert old is not None and lease.acquire("run-b") is None  # renewed: still held at 9 + 9 s

    clock.now += 10.5
    new = lease.acquire("run-b")

    assert new is not None and new.holder == "run-b" and new.generation == 2
    assert lease.renew(old) is None and lease.hand_over(old) is None and not lease.release(old)


def test_hand_over_goes_to_a_fresh_registered_successor_with_the_next_generation(wal):
    clock = Clock()
    lease = lease_of(wal, clock)
    held = lease.acquire("run-a")
    assert lease.hand_over(held) is None  # nobody waits yet
    assert lease.offer("run-b") and not lease.offer("run-c")  # one successor at a time
    held = lease.want_successor(held)
    assert held is not None and held.wanted

    assert lease.hand_over(held) == "run-b"

    taken = lease.acquire("run-b")
    assert taken is not None and taken.generation == 2 and not taken.wanted and taken.successor == ""
    assert lease.renew(held) is None


def test_a_late_offer_from_the_run_it_was_handed_to_changes_nothing(wal):
    """The successor's wait loop offered once more just after the hand-over: it became its own successor,
    handed the shard to itself at its first look, and ended with the shard held by no live run."""
    lease = lease_of(wal)
    held = lease.want_successor(lease.acquire("run-a"))
    lease.offer("run-b")
    assert lease.hand_over(held) == "run-b"

    assert lease.offer("run-b")  # the late offer
    taken = lease.acquire("run-b")

    assert taken is not None and taken.successor == "" and lease.hand_over(taken) is None
    assert lease.read().holder == "run-b" and lease.read().generation == 2


def test_a_successor_that_stopped_waiting_is_not_handed_the_lease(wal):
    clock = Clock()
    lease = lease_of(wal, clock)
    held = lease.acquire("run-a")
    lease.offer("run-b")

    clock.now += 11  # run-b has not refreshed its offer for longer than the lease's ttl
    held = lease.renew(held)

    assert lease.hand_over(held) is None and lease.offer("run-c")


def test_a_holder_found_dead_loses_the_lease_at_once(wal):
    lease = lease_of(wal)
    held = lease.acquire("run-a")

    assert not lease.break_dead("run-b") and lease.break_dead("run-a")

    taken = lease.acquire("run-b")
    assert taken is not None and taken.generation == 2 and lease.renew(held) is None


def test_each_shard_count_has_leases_of_its_own(wal):
    assert lease_of(wal, shard=1, shards=2).acquire("run-a") is not None
    assert lease_of(wal, shard=1, shards=4).acquire("run-b") is not None


@pytest.mark.parametrize("shard,shards,ttl", [(2, 2, 10.0), (-1, 2, 10.0), (0, 2, 0.0)])
def test_a_bad_lease_is_refused(wal, shard, shards, ttl):
    with pytest.raises(WalInputError):
        ShardLease(wal.wal_table(), shard, shards, ttl_s=ttl)


def test_a_successor_that_withdrew_is_not_handed_the_lease(wal):
    lease = lease_of(wal)
    held = lease.acquire("run-a")
    lease.offer("run-b")

    assert not lease.withdraw("run-c") and lease.withdraw("run-b")

    assert lease.hand_over(held) is None and lease.read().holder == "run-a"


class OfferingClock(Clock):
    """A clock that, at one chosen reading, has another run register as successor first: the offer moves
    the lease's version between the holder's read and its write."""

    def __init__(self, wal, offer_at_call: int) -> None:
        super().__init__()
        self.calls, self.offer_at_call, self.other = 0, offer_at_call, lease_of(wal)

    def __call__(self) -> float:
        self.calls += 1
        if self.calls == self.offer_at_call:
            assert self.other.offer("run-waiting")
        return super().__call__()


def test_a_holder_whose_renewal_races_an_offer_keeps_its_lease(wal):
    """Before, the holder's conditional write lost to the offer and it took that for a lost lease: an
    always-on run ended while it still held its shard (a test_holding failure in CI)."""
    clock = OfferingClock(wal, offer_at_call=10**9)
    lease = ShardLease(wal.wal_table(), 0, 2, ttl_s=10.0, clock=clock)
    held = lease.acquire("run-holder")
    assert held is not None
    clock.offer_at_call = clock.calls + 1  # renew reads the lease, then the clock: the offer lands between

    renewed = lease.renew(held)

    assert renewed is not None and renewed.generation == held.generation
    current = lease.read()
    assert current.holder == "run-holder" and current.successor == "run-waiting"
    assert lease.want_successor(renewed) is not None and lease.release(lease.read())
