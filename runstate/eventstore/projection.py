"""The pure fold: (RunSnapshot, events) -> RunSnapshot.

No I/O. Events at or below the snapshot's `last_event_seq` are skipped, so folding the same
events twice changes nothing and incremental projection equals a rebuild from scratch.
Unknown event types only move `last_event_seq`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

from runstate.eventstore.contract import EventType, RunSnapshot, StepState


class FoldedEvent(Protocol):
    """What the fold reads of an event: a StoredEvent, or a row of the run history holding these alone."""

    @property
    def run_seq(self) -> int: ...
    @property
    def event_type(self) -> str: ...
    @property
    def step_id(self) -> str | None: ...
    @property
    def emitted_at(self) -> datetime: ...
    @property
    def data(self) -> Any: ...


_TERMINAL_STATUSES = frozenset({"COMPLETED", "FAILED", "CANCELLED"})
# A step being folded is a list [status, attempts, started_at, completed_at, error] until the fold
# ends: a StepState (a frozen dataclass) per event was most of a fold's cost.
_STATUS, _ATTEMPTS, _STARTED, _COMPLETED, _ERROR = range(5)


def fold(snapshot: RunSnapshot, events: Iterable[FoldedEvent]) -> RunSnapshot:
    """Apply `events` (run_seq ascending) to `snapshot`; returns a new snapshot."""
    state = _Mutable(snapshot)
    for event in events:
        if event.run_seq <= state.last_event_seq:
            continue
        handler = _HANDLERS.get(event.event_type)
        if handler is not None:
            handler(state, event)
        state.last_event_seq = event.run_seq
    return state.freeze(snapshot)


class _Mutable:
    """A scratch copy so a long fold does not rebuild frozen values per event."""

    def __init__(self, snapshot: RunSnapshot):
        self.status = snapshot.status
        self.started_at = snapshot.started_at
        self.completed_at = snapshot.completed_at
        self.last_event_seq = snapshot.last_event_seq
        self.steps: dict[str, StepState | list[Any]] = dict(snapshot.steps)
        self.artifacts: list[Any] = list(snapshot.artifacts)

    def freeze(self, original: RunSnapshot) -> RunSnapshot:
        return replace(
            original,
            status=self.status,
            started_at=self.started_at,
            completed_at=self.completed_at,
            last_event_seq=self.last_event_seq,
            steps={k: StepState(*v) if type(v) is list else v for k, v in self.steps.items()},
            artifacts=tuple(self.artifacts),
        )

    def set_run_status(self, status: str) -> None:
        # A finished run stays finished: late step events must not reopen it.
        if self.status not in _TERMINAL_STATUSES:
            self.status = status

    def step(self, step_id: str | None) -> list[Any]:
        """The step's mutable state (a new step is RUNNING with no attempts)."""
        key = step_id or ""
        current = self.steps.get(key)
        if type(current) is list:
            return current
        if current is None:
            fresh: list[Any] = ["RUNNING", 0, None, None, None]
        else:
            fresh = [
                current.status,
                current.attempts,
                current.started_at,
                current.completed_at,
                current.error,
            ]
        self.steps[key] = fresh
        return fresh


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


def _error_of(data: Any) -> Any:
    if isinstance(data, dict) and "error" in data:
        return data["error"]
    return data


def _run_started(s: _Mutable, e: FoldedEvent) -> None:
    s.set_run_status("RUNNING")
    if s.started_at is None:
        s.started_at = _utc(e.emitted_at)


def _step_started(s: _Mutable, e: FoldedEvent) -> None:
    step = s.step(e.step_id)
    step[:] = ["RUNNING", step[_ATTEMPTS] + 1, _utc(e.emitted_at), None, None]
    if s.status == "PENDING":
        s.set_run_status("RUNNING")


def _step_completed(s: _Mutable, e: FoldedEvent) -> None:
    _finish_step(s, e, "SUCCESS", error=None)


def _step_failed(s: _Mutable, e: FoldedEvent) -> None:
    _finish_step(s, e, "FAILED", error=_error_of(e.data))


def _finish_step(s: _Mutable, e: FoldedEvent, status: str, error: Any) -> None:
    step = s.step(e.step_id)
    step[_STATUS] = status
    step[_ATTEMPTS] = max(step[_ATTEMPTS], 1)
    step[_COMPLETED] = _utc(e.emitted_at)
    step[_ERROR] = error


def _step_retrying(s: _Mutable, e: FoldedEvent) -> None:
    step = s.step(e.step_id)
    step[_STATUS] = "RETRYING"
    step[_ATTEMPTS] = max(step[_ATTEMPTS], 1)
    if e.data is not None:
        step[_ERROR] = _error_of(e.data)


def _signal_waiting(s: _Mutable, e: FoldedEvent) -> None:
    s.set_run_status("WAITING")


def _signal_received(s: _Mutable, e: FoldedEvent) -> None:
    if s.status == "WAITING":
        s.status = "RUNNING"


def _artifact_emitted(s: _Mutable, e: FoldedEvent) -> None:
    s.artifacts.append({"runSeq": e.run_seq, "stepId": e.step_id, "data": e.data})


def _finisher(status: str) -> Callable[[_Mutable, FoldedEvent], None]:
    def finish(s: _Mutable, e: FoldedEvent) -> None:
        if s.status in _TERMINAL_STATUSES:
            return
        s.status = status
        s.completed_at = _utc(e.emitted_at)
        if s.started_at is None:
            s.started_at = _utc(e.emitted_at)

    return finish


# The event types whose handler reads `data`: for the rest a caller folding freshly appended events
# may skip decoding it (the append path's inline snapshot does).
READS_DATA = frozenset({EventType.STEP_FAILED, EventType.STEP_RETRYING, EventType.ARTIFACT_EMITTED})

_HANDLERS: dict[str, Callable[[_Mutable, FoldedEvent], None]] = {
    EventType.RUN_STARTED: _run_started,
    EventType.STEP_STARTED: _step_started,
    EventType.STEP_COMPLETED: _step_completed,
    EventType.STEP_FAILED: _step_failed,
    EventType.STEP_RETRYING: _step_retrying,
    EventType.SIGNAL_WAITING: _signal_waiting,
    EventType.SIGNAL_RECEIVED: _signal_received,
    EventType.ARTIFACT_EMITTED: _artifact_emitted,
    EventType.RUN_COMPLETED: _finisher("COMPLETED"),
    EventType.RUN_FAILED: _finisher("FAILED"),
    EventType.RUN_CANCELLED: _finisher("CANCELLED"),
}
