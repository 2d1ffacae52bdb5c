"""Always-on shard runs (runstate.wal.holding) on the real WAL table and bucket: the hand-over leaves no
gap and no overlap, a frozen holder that lost its lease writes nothing, and a run whose successor never
comes lets the shard go.

Each run is a thread driving ShardRounds as the flush op does; every flush, lease write and append is
real. The bounds are generous: the machine is shared."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from runstate.wal import DatasetReader, WalProducer
from runstate.wal.holding import ShardRounds, ShardTerm
from runstate.wal.lease import LeaseState, ShardLease
from runstate.wal.shards import DatasetOutcome, flush_shard, shard_of

from .helpers import statuses

SHARDS = 2
TTL_S = 5.0


def datasets_of(shard: int, count: int) -> list[str]:
    return [name for name in (f"ds{i}" for i in range(1000)) if shard_of(name, SHARDS) == shard][:count]


@dataclass
class Window:
    holder: str
    generation: int
    start: float
    end: float
    applied: int


@dataclass
class Timeline:
    """What the runs did, on one monotonic clock: flush windows, lease takes and hand-overs."""

    windows: list[Window] = field(default_factory=list)
    taken: dict[str, tuple[float, int]] = field(default_factory=dict)
    handed: dict[str, float] = field(default_factory=dict)
    ended: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class RecordingLease(ShardLease):
    """The real lease; it notes when each holder first holds it and when it hands it over."""

    def __init__(self, timeline: Timeline, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.timeline = timeline

    def acquire(self, holder: str) -> LeaseState | None:
        state = super().acquire(holder)
        if state is not None:
            self.timeline.taken.setdefault(holder, (time.monotonic(), state.generation))
        return state

    def hand_over(self, state: LeaseState) -> str | None:
        successor = super().hand_over(state)
        if successor is not None:
            self.timeline.handed[state.holder] = time.monotonic()
        return successor


def shard_rounds(wal, timeline: Timeline, holder: str, term: ShardTerm, ttl_s: float = TTL_S) -> ShardRounds:
    table = wal.wal_table()
    lease = RecordingLease(timeline, table, 0, SHARDS, ttl_s=ttl_s)
    return ShardRounds(lease, table, holder=holder, shard=0, shards=SHARDS, term=term, max_batch_size=500)


def flush_round(wal, timeline: Timeline, rounds: ShardRounds, holder: str, batches) -> list[DatasetOutcome]:
    table, blobs = wal.owners()
    start = time.monotonic()
    outcomes = flush_shard(table, blobs, batches, retry_delay_s=0.01)
    with timeline.lock:
        applied = sum(outcome.applied for outcome in outcomes)
        timeline.windows.append(Window(holder, rounds.state.generation, start, time.monotonic(), applied))
    rounds.record(outcomes)
    return outcomes


def drive(wal, timeline: Timeline, holder: str, term: ShardTerm) -> None:
    """One always-on run: flush every round until it ends."""
    rounds = shard_rounds(wal, timeline, holder, term)
    for batches in rounds:
        flush_round(wal, timeline, rounds, holder, batches)
    timeline.ended[holder] = rounds.ended


def test_the_successor_holds_the_shard_before_its_predecessor_stops_with_no_gap_and_no_overlap(wal):
    timeline, datasets = Timeline(), datasets_of(0, 3)
    producer = WalProducer(wal.dynamodb, wal.table)
    predecessor = threading.Thread(
        target=drive, args=(wal, timeline, "run-p", ShardTerm(budget_s=1.5, handover_wait_s=30, poll_s=0.1))
    )
    successor = threading.Thread(
        target=drive, args=(wal, timeline, "run-s", ShardTerm(budget_s=10.0, handover_wait_s=0.5, poll_s=0.1))
    )
    appended: list[tuple[str, int]] = []
    rows_for_the_successor = 5

    def append_rows() -> None:
        # Until the successor has had a few rows to flush: on a loaded machine the hand-over comes late,
        # and a fixed number of rows could all be flushed before it.
        deadline, left = time.monotonic() + 60, rows_for_the_successor
        while left and time.monotonic() < deadline:
            i, dataset = len(appended), datasets[len(appended) % len(datasets)]
            appended.append((dataset, producer.append(dataset, [_upsert(f"k{i}", i)])))
            left -= "run-s" in timeline.taken
            time.sleep(0.1)

    appender = threading.Thread(target=append_rows)
    predecessor.start()
    appender.start()
    lease = ShardLease(wal.wal_table(), 0, SHARDS)
    deadline = time.monotonic() + 60
    while not lease.read().wanted and time.monotonic() < deadline:  # as wal_sensor does
        time.sleep(0.1)
    successor.start()
    for thread in (appender, predecessor, successor):
        thread.join(timeout=120)
    assert not appender.is_alive()
    assert sum(w.applied for w in timeline.windows if w.holder == "run-s") >= 1, (timeline, len(appended))

    assert timeline.ended["run-p"] == "shard 0: generation 1 handed to run-s"
    handed, (taken, generation) = timeline.handed["run-p"], timeline.taken["run-s"]
    assert generation == 2
    before = [w for w in timeline.windows if w.holder == "run-p"]
    after = [w for w in timeline.windows if w.holder == "run-s"]
    assert before and after, timeline.windows
    assert {w.generation for w in before} == {1} and {w.generation for w in after} == {2}
    # No overlap: the predecessor's last flush ended before it handed over; the successor flushed only after.
    assert max(w.end for w in before) <= handed <= taken <= min(w.start for w in after)
    # No gap: the successor held the shard within a poll (plus a loaded machine's slack) of the hand-over.
    assert taken - handed < 0.1 + 2.0, (handed, taken)
    # Every row applied, once.
    assert sum(w.applied for w in timeline.windows) == len(appended)
    for dataset in datasets:
        assert set(statuses(wal.dynamodb, wal.table, dataset).values()) == {"Applied#" + _month()}
        version, state = DatasetReader(wal.s3, wal.bucket, wal.prefix, dataset).read()
        assert version == max(seq for ds, seq in appended if ds == dataset) and len(state) == version


def test_a_frozen_holder_whose_lease_expired_writes_nothing_once_it_wakes(wal):
    timeline, [dataset] = Timeline(), datasets_of(0, 1)
    producer = WalProducer(wal.dynamodb, wal.table)
    frozen = shard_rounds(wal, timeline, "run-p", ShardTerm(budget_s=60, poll_s=0.05), ttl_s=1.0)
    rounds = iter(frozen)
    producer.append(dataset, [_upsert("a", 1)])
    flush_round(wal, timeline, frozen, "run-p", next(rounds))

    time.sleep(1.5)  # SIGSTOP past its lease: another run takes the shard and flushes a new row
    producer.append(dataset, [_upsert("b", 2)])
    drive(wal, timeline, "run-s", ShardTerm(budget_s=1.0, handover_wait_s=0.2, poll_s=0.05))
    producer.append(dataset, [_upsert("c", 3)])
    resumed = list(rounds)  # SIGCONT

    assert resumed == [] and frozen.ended == "shard 0: lease generation 1 lost"
    assert timeline.taken["run-s"][1] == 2
    assert [(w.holder, w.applied) for w in timeline.windows] == [("run-p", 1), ("run-s", 1)]
    assert statuses(wal.dynamodb, wal.table, dataset)[3] == "Pending"


def test_a_run_whose_successor_never_comes_lets_the_shard_go(wal):
    timeline = Timeline()

    drive(wal, timeline, "run-p", ShardTerm(budget_s=0.3, handover_wait_s=0.3, poll_s=0.05))

    assert timeline.ended["run-p"] == "shard 0: no successor 0.3 s past the budget"
    state = ShardLease(wal.wal_table(), 0, SHARDS).read()
    assert state.holder == "" and state.generation == 1
    assert ShardLease(wal.wal_table(), 0, SHARDS).acquire("run-q").generation == 2


def _upsert(key: str, value: int):
    from runstate.wal import Change

    return Change.upsert(key, value)


def _month() -> str:
    return time.strftime("%Y-%m", time.gmtime())


def test_a_waiting_run_that_is_interrupted_withdraws_so_the_holder_keeps_the_shard(wal):
    table = wal.wal_table()
    lease = ShardLease(table, 0, SHARDS, ttl_s=TTL_S)
    held = lease.acquire("run-p")

    def interrupted(seconds: float) -> None:  # SIGTERM while it waits, after it registered
        raise KeyboardInterrupt

    waiting = ShardRounds(
        lease,
        table,
        holder="run-s",
        shard=0,
        shards=SHARDS,
        term=ShardTerm(budget_s=60),
        max_batch_size=500,
        sleep=interrupted,
    )
    try:  # as the flush op drives it
        for _ in waiting:
            pass
    except KeyboardInterrupt:
        pass
    finally:
        waiting.stop()

    assert waiting.ended == "shard 0: stopped while waiting for the lease"
    assert lease.read().successor == "" and lease.hand_over(held) is None
