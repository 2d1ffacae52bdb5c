"""What a store last saw of each run it wrote: the guess that lets an append send its snapshot with it.

An append whose batch crosses a multiple of `snapshot_interval` must write a snapshot in the same
transaction, and the snapshot (by default the run's projection) depends on where the run stands.
Asking the database first costs round trips; instead the store keeps, per run it wrote, the last
seq, the event count and the projection through that seq, and computes the snapshot from them.
The database checks the guess in the append's own statement and refuses the append when it was
wrong (another process wrote the run meanwhile), and the store then appends the slow way. So a hint
can only cost time, never correctness. A run this store has not seen is guessed to be new.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from runstate.eventstore.contract import RunSnapshot
from runstate.eventstore.projection import READS_DATA, fold
from runstate.eventstore.validation import ValidEvent

DEFAULT_RUNS = 4096


class FoldEvent(NamedTuple):
    """What the fold reads of an event (cheaper to build than a StoredEvent)."""

    run_seq: int
    event_type: str
    emitted_at: datetime
    step_id: str | None
    data: Any


@dataclass(frozen=True)
class RunHint:
    last_seq: int
    event_count: int
    projection: RunSnapshot | None  # through last_seq; None when this store does not know it


def fold_new(base: RunSnapshot, new: Sequence[tuple[int, ValidEvent]]) -> RunSnapshot:
    """`base` with freshly appended (run_seq, event) rows folded in; `data` is decoded only for the
    event types whose handler reads it."""
    return fold(base, (_fold_event(seq, event) for seq, event in new))  # type: ignore[arg-type]


def _fold_event(seq: int, event: ValidEvent) -> FoldEvent:
    data = None
    if event.event_type in READS_DATA and event.data_json is not None:
        data = json.loads(event.data_json)
    return FoldEvent(seq, event.event_type, event.emitted_at, event.step_id, data)


class RunHints:
    """An LRU of RunHint per run id; thread-safe."""

    def __init__(self, size: int = DEFAULT_RUNS):
        self._size = size
        self._hints: OrderedDict[str, RunHint] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_id: str) -> RunHint:
        with self._lock:
            hint = self._hints.get(run_id)
        return hint if hint is not None else RunHint(0, 0, RunSnapshot.empty(run_id))

    def known(self, run_id: str) -> RunHint | None:
        with self._lock:
            return self._hints.get(run_id)

    def put(self, run_id: str, hint: RunHint) -> None:
        with self._lock:
            self._hints[run_id] = hint
            self._hints.move_to_end(run_id)
            while len(self._hints) > self._size:
                self._hints.popitem(last=False)

    def after_append(
        self,
        run_id: str,
        before: int,
        count_before: int,
        new: Sequence[tuple[int, ValidEvent]],
        projection: RunSnapshot | None = None,
    ) -> None:
        """Record a committed append of `new` to a run that stood at (before, count_before).
        `projection` is the run's projection after it, when the append computed it."""
        if not new:
            return
        last_seq = max(before, new[-1][0])
        if projection is None or projection.last_event_seq != last_seq:
            known = self.known(run_id)
            if before == 0 and count_before == 0:
                projection = fold_new(RunSnapshot.empty(run_id), new)
            elif known is not None and known.projection is not None and known.last_seq == before:
                projection = fold_new(known.projection, new)
            else:
                projection = None
        self.put(run_id, RunHint(last_seq, count_before + len(new), projection))

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._hints.pop(run_id, None)
