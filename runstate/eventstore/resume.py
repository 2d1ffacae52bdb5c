"""Resume: what a worker needs to continue a run (the latest valid snapshot and the events after it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runstate.eventstore.contract import InvalidEvent, RunSnapshot, StoredEvent
from runstate.eventstore.projection import fold


@dataclass(frozen=True)
class Resume:
    """The latest valid snapshot state (None on a full replay), the run_seq it was taken at (0 on a
    full replay) and the events after it.

    `kind` is "projection" when `state` is a RunSnapshot.to_dict(), "state" when it is the
    caller's own state passed to append_batch/checkpoint, and "none" on a full replay.
    """

    state: Any
    snapshot_seq: int
    events: list[StoredEvent]
    kind: str = "none"
    fallbacks: int = 0

    def run_snapshot(self, run_id: str) -> RunSnapshot:
        """The projected RunSnapshot, when the snapshot is a projection (or on a full replay)."""
        if self.kind == "projection":
            base = RunSnapshot.from_dict(self.state)
        elif self.kind == "none":
            base = RunSnapshot.empty(run_id)
        else:
            raise InvalidEvent(
                "state",
                f"snapshot at seq {self.snapshot_seq} holds caller state, not a projection",
                run_id=run_id,
            )
        return fold(base, self.events)
