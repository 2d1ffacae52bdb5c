"""An always-on flush shard run: it holds its shard's lease, polls the shard and flushes, and hands the
shard to its successor before it ends.

Through the daemon a new flush run is a process that loads the code location: after an idle minute the
first rows waited 17-20 s for it. A run that keeps its shard saves that start for every row. It still
ends (a budget: its age; a new code version comes with the successor), the way Temporal's
continue-as-new does:

1. it takes the shard's lease (`lease.py`), or registers as successor and waits until it is handed over,
   or until the holder's lease is released, expires or is broken (its run was found dead);
2. it polls its shard's Pending rows every `poll_s` and yields them as batches to flush; before each
   round its lease is renewed (a lost lease ends it before it writes);
3. at its budget it marks "successor wanted" (the sensor requests the successor run) and goes on
   flushing; between two rounds, once a successor has registered, it hands the lease over and ends;
4. no successor `handover_wait_s` past the budget (the sensor is off, say): it releases the lease and
   ends, and the sensor starts a new run.

    rounds = ShardRounds(lease, table, holder=run_id, shard=0, shards=2, term=term, max_batch_size=500)
    for batches in rounds:
        rounds.record(flush(batches))
    rounds.ended  # why it ended

Each round is flushed between two looks at the lease: a successor takes the shard only from a lease
handed over, released, expired or broken, never in the middle of a round of a live holder.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from runstate.wal.errors import WalInputError
from runstate.wal.lease import LeaseState, ShardLease
from runstate.wal.linger import shard_pending
from runstate.wal.shards import DatasetOutcome
from runstate.wal.source import Batch, plan_batches
from runstate.wal.table import WalTable

FAILED_COOLDOWN_S = 30.0  # a dataset that failed waits this long before the run tries it again


@dataclass(frozen=True)
class ShardTerm:
    """How a run holds its shard: `budget_s` of age before it wants a successor, then at most
    `handover_wait_s` for one; a look every `poll_s`; `take_wait_s` at most to get the lease."""

    budget_s: float
    handover_wait_s: float = 60.0
    poll_s: float = 0.5
    take_wait_s: float = 300.0

    def __post_init__(self) -> None:
        if self.budget_s < 0 or self.handover_wait_s < 0 or self.poll_s <= 0 or self.take_wait_s < 0:
            raise WalInputError(f"a shard term needs budgets >= 0 and poll_s > 0, got {self}")


class ShardRounds:
    """The always-on loop as an iterator of rounds (see the module): each item is batches to flush now,
    under a lease renewed just before. `initial` batches (the sensor's plan) come first."""

    def __init__(
        self,
        lease: ShardLease,
        table: WalTable,
        *,
        holder: str,
        shard: int,
        shards: int,
        term: ShardTerm,
        max_batch_size: int,
        initial: Iterable[Batch] = (),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._lease, self._table, self._holder = lease, table, holder
        self._shard, self._shards, self._term = shard, shards, term
        self._max_batch_size, self._initial = max_batch_size, list(initial)
        self._clock, self._sleep = clock, sleep
        self._failed: dict[str, float] = {}  # dataset -> when it may be tried again
        self.state: LeaseState | None = None
        self.ended = ""
        self.handed_to = ""

    def __iter__(self) -> Iterator[list[Batch]]:
        self.state = self._take()
        if self.state is None:
            self.ended = f"shard {self._shard}: lease not had within {self._term.take_wait_s:g} s"
            return
        started = self._clock()
        if self._initial and self._keep(renew=True):
            yield self._initial
        while self._keep():
            if self._handed_over():
                return
            age = self._clock() - started
            if age >= self._term.budget_s and not self._near_end(age):
                return
            keys = shard_pending(self._table, self._shard, self._shards, self._skipped())
            if not keys:
                self._sleep(self._term.poll_s)
                continue
            if not self._keep(renew=True):  # a round is flushed only under a lease just proven ours
                return
            yield plan_batches(keys, max_batch_size=self._max_batch_size)

    def record(self, outcomes: list[DatasetOutcome]) -> None:
        """What flushing the last round did: a failed dataset rests for FAILED_COOLDOWN_S."""
        until = self._clock() + FAILED_COOLDOWN_S
        self._failed.update({outcome.dataset_id: until for outcome in outcomes if not outcome.ok})

    def stop(self) -> None:
        """The run is ending early (an interrupt, an error): let the lease go if held, or stop waiting for it
        (a predecessor must not hand the shard to a run that is gone)."""
        if self.ended:
            return
        if self.state is None:
            self._lease.withdraw(self._holder)
            self.ended = f"shard {self._shard}: stopped while waiting for the lease"
        else:
            self._lease.release(self.state)
            self.ended = f"shard {self._shard}: stopped, lease released"

    # --- the lease -----------------------------------------------------------------------------------

    def _take(self) -> LeaseState | None:
        deadline = self._clock() + self._term.take_wait_s
        while True:
            state = self._lease.acquire(self._holder)
            if state is not None:
                return state
            if self._clock() >= deadline:
                return None
            self._lease.offer(self._holder)  # registers, or refreshes, this run as the successor
            self._sleep(self._term.poll_s)

    def _keep(self, renew: bool = False) -> bool:
        """Renew the lease (always before a round, else once a quarter of it is used); False (ended) once
        it was lost."""
        assert self.state is not None
        if not renew and self.state.expires_at - self._lease.clock() > self._lease.ttl_s * 0.75:
            return True
        renewed = self._lease.renew(self.state)
        if renewed is None:
            self.ended = f"shard {self._shard}: lease generation {self.state.generation} lost"
            return False
        self.state = renewed
        return True

    def _handed_over(self) -> bool:
        assert self.state is not None
        successor = self._lease.hand_over(self.state)
        if successor is None:
            return False
        self.handed_to = successor
        self.ended = f"shard {self._shard}: generation {self.state.generation} handed to {successor}"
        return True

    def _near_end(self, age: float) -> bool:
        """Past the budget: want a successor; True while it may still wait for one."""
        assert self.state is not None
        if not self.state.wanted:
            wanted = self._lease.want_successor(self.state)
            if wanted is None:
                self.ended = f"shard {self._shard}: lease generation {self.state.generation} lost"
                return False
            self.state = wanted
        if age < self._term.budget_s + self._term.handover_wait_s:
            return True
        self._lease.release(self.state)
        self.ended = f"shard {self._shard}: no successor {self._term.handover_wait_s:g} s past the budget"
        return False

    def _skipped(self) -> set[str]:
        now = self._clock()
        return {dataset for dataset, until in self._failed.items() if until > now}
