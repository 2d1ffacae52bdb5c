"""A lingering shard run: new rows of its shard flushed as they come, others left alone, and an end.

The clock is the test's own (each poll advances it by the poll interval), so the idle and budget
limits are checked exactly, while every flush, query and append is real.
"""

from __future__ import annotations

import pytest

from runstate.wal import Change, DatasetReader, WalInputError, WalProducer
from runstate.wal.linger import Linger, LingerPlans
from runstate.wal.shards import flush_shard, shard_of

from .faults import Faults
from .helpers import statuses

SHARDS = 2


def datasets_of(shard: int, count: int, prefix: str = "ds") -> list[str]:
    names = (f"{prefix}{i}" for i in range(1000))
    return [name for name in names if shard_of(name, SHARDS) == shard][:count]


class Clock:
    """Fake time: `sleep` advances it and first runs whatever the test scheduled for that moment."""

    def __init__(self, on_sleep=lambda now: None) -> None:
        self.now = 0.0
        self.on_sleep = on_sleep

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.on_sleep(self.now)


def run_linger(wal, clock: Clock, linger: Linger, flush=None, failed=()) -> list[list]:
    """Drive the loop as the flush op does: flush each round's batches and hand the outcomes back."""
    table, blobs = wal.owners()
    flush = flush or (lambda batches: flush_shard(table, blobs, batches, retry_delay_s=0.01))
    plans = LingerPlans(
        table,
        shard=0,
        shards=SHARDS,
        linger=linger,
        max_batch_size=500,
        failed=failed,
        clock=clock,
        sleep=clock.sleep,
    )
    rounds = []
    for batches in plans:
        rounds.append(flush(batches))
        plans.record(rounds[-1])
    return rounds


def test_rows_that_arrive_while_it_lingers_are_flushed_and_it_ends_once_idle(wal):
    mine, theirs = datasets_of(0, 2), datasets_of(1, 1)
    producer = WalProducer(wal.dynamodb, wal.table)
    arrivals = {2.0: mine[0], 3.0: mine[1], 5.0: theirs[0], 7.0: mine[0]}

    def append_due(now: float) -> None:
        if now in arrivals:
            producer.append(arrivals[now], [Change.upsert("k", now)])

    clock = Clock(append_due)
    rounds = run_linger(wal, clock, Linger(idle_s=4, budget_s=60))

    flushed = [(o.dataset_id, o.applied) for outcomes in rounds for o in outcomes]
    assert flushed == [(mine[0], 1), (mine[1], 1), (mine[0], 1)]
    assert clock.now == 11.0  # the last row came at 7 s, then 4 s idle
    _, blobs = wal.owners()
    assert DatasetReader.of(blobs, mine[0]).read() == (2, {"k": 7.0})
    assert set(statuses(wal.dynamodb, wal.table, theirs[0]).values()) == {"Pending"}  # another shard's


def test_a_steady_stream_of_rows_ends_at_the_budget(wal):
    [dataset] = datasets_of(0, 1)
    producer = WalProducer(wal.dynamodb, wal.table)
    clock = Clock(lambda now: producer.append(dataset, [Change.upsert("k", now)]))

    rounds = run_linger(wal, clock, Linger(idle_s=3, budget_s=10))

    assert clock.now == 10.0 and len(rounds) == 10
    _, blobs = wal.owners()
    assert DatasetReader.of(blobs, dataset).version == 10


def test_a_dataset_that_fails_is_left_to_the_next_run_and_the_others_go_on(wal):
    good, bad, failed_before = datasets_of(0, 3)
    producer = WalProducer(wal.dynamodb, wal.table)
    for dataset in (good, bad, failed_before):
        producer.append(dataset, [Change.upsert("k", 1)])
    table, blobs = wal.owners()
    blobs.client = s3 = wal.client("s3")
    faults = Faults(s3, "PutObject", count=1000, when=lambda params: f"/{bad}/" in params.get("Key", ""))
    clock = Clock(lambda now: producer.append(good, [Change.upsert("k", now)]) if now == 3.0 else None)

    rounds = run_linger(
        wal,
        clock,
        Linger(idle_s=2, budget_s=60),
        flush=lambda batches: flush_shard(table, blobs, batches, attempts=2, retry_delay_s=0.01),
        failed=[failed_before],
    )

    tried = [sorted(o.dataset_id for o in outcomes) for outcomes in rounds]
    assert tried == [sorted([bad, good]), [good]] and faults.failed == 2  # bad: 2 attempts, in one round only
    assert DatasetReader.of(blobs, good).version == 2
    for dataset in (bad, failed_before):
        assert set(statuses(wal.dynamodb, wal.table, dataset).values()) == {"Pending"}


def test_no_linger_polls_nothing(wal):
    clock = Clock()
    assert run_linger(wal, clock, Linger(idle_s=0, budget_s=60)) == [] and clock.now == 0.0


@pytest.mark.parametrize("idle_s, budget_s, poll_s", [(-1, 10, 1), (1, -1, 1), (1, 10, 0)])
def test_a_bad_linger_is_refused(idle_s, budget_s, poll_s):
    with pytest.raises(WalInputError, match="linger needs"):
        Linger(idle_s=idle_s, budget_s=budget_s, poll_s=poll_s)
