"""The event store contract: events in, stored events and snapshots out, validated at the edge.

Plain Python only (no dagster, no drivers): both backends and the Dagster shell build on it.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # resume.py folds with projection.py, which imports this module
    pass

DEFAULT_MAX_EVENT_BYTES = 1024 * 1024
MAX_RUN_ID_CHARS = 256


class EventType:
    """The canonical event types. Other types are stored too; the projector ignores them."""

    RUN_STARTED = "RunStarted"
    STEP_STARTED = "StepStarted"
    STEP_COMPLETED = "StepCompleted"
    STEP_FAILED = "StepFailed"
    STEP_RETRYING = "StepRetrying"
    SIGNAL_WAITING = "SignalWaiting"
    SIGNAL_RECEIVED = "SignalReceived"
    ARTIFACT_EMITTED = "ArtifactEmitted"
    RUN_COMPLETED = "RunCompleted"
    RUN_FAILED = "RunFailed"
    RUN_CANCELLED = "RunCancelled"


CANONICAL_EVENT_TYPES: frozenset[str] = frozenset(
    value for name, value in vars(EventType).items() if name.isupper()
)
TERMINAL_EVENT_TYPES: frozenset[str] = frozenset(
    {EventType.RUN_COMPLETED, EventType.RUN_FAILED, EventType.RUN_CANCELLED}
)

RUN_STATUSES = ("PENDING", "RUNNING", "WAITING", "COMPLETED", "FAILED", "CANCELLED")
STEP_STATUSES = ("RUNNING", "SUCCESS", "FAILED", "RETRYING")


class EventStoreError(RuntimeError):
    """The root of every event store error: bad input, conflicts, and driver failures (translated
    inside each store), so one `except EventStoreError` covers all that the store can raise."""


class InvalidEvent(EventStoreError, ValueError):
    """An event failed validation; `field` names the offending field. Nothing was written.
    (Also a ValueError: bad input is a value error to callers that predate the root.)"""

    def __init__(self, field: str, message: str, *, run_id: str | None = None, index: int | None = None):
        self.field = field
        self.run_id = run_id
        self.index = index
        where = f"event #{index} " if index is not None else "event "
        if run_id:
            where += f"of run {run_id[:80]!r} "
        super().__init__(f"{where}field {field!r}: {message}")


class SnapshotCorrupt(EventStoreError):
    """A stored state snapshot failed its checksum or could not be decoded."""


class ConcurrencyConflict(EventStoreError):
    """Another writer won: `append(..., expected_last_seq=N)` found the run at another seq
    (`run_id`, `expected` and `actual` are set), or a retried transaction kept losing races."""

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        expected: int | None = None,
        actual: int | None = None,
    ):
        super().__init__(message)
        self.run_id = run_id
        self.expected = expected
        self.actual = actual

    @classmethod
    def stale(cls, run_id: str, expected: int, actual: int) -> ConcurrencyConflict:
        return cls(
            f"run {run_id[:80]!r}: expected last seq {expected}, but the run is at seq {actual}",
            run_id=run_id,
            expected=expected,
            actual=actual,
        )


def idempotency_key(
    run_id: str,
    step_id: str | None,
    logical_attempt_id: str | None,
    event_type: str,
    plan_version: str | None,
) -> str:
    """SHA-256 hex of the parts joined with `|`, None written as the empty string."""
    parts = (run_id, step_id, logical_attempt_id, event_type, plan_version)
    joined = "|".join("" if part is None else str(part) for part in parts)
    # surrogatepass: a malformed string still hashes here; validate_event rejects it with a clear error.
    return hashlib.sha256(joined.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class NewEvent:
    """An event to append. `idempotency_key` defaults to `idempotency_key(...)` of its parts;
    `event_id` defaults to a fresh UUID4. Validation happens at the store's edge (append)."""

    run_id: str
    event_type: str
    emitted_at: datetime
    data: Any = None
    step_id: str | None = None
    engine_attempt_id: str | None = None
    logical_attempt_id: str | None = None
    plan_version: str | None = None
    event_id: str | uuid.UUID | None = None
    idempotency_key: str | None = None
    caused_by_signal_id: str | uuid.UUID | None = None
    parent_event_id: str | uuid.UUID | None = None
    adapter_version: str | None = None
    engine_run_ref: Any = None

    def __post_init__(self) -> None:
        if self.idempotency_key is None and isinstance(self.run_id, str) and isinstance(self.event_type, str):
            key = idempotency_key(
                self.run_id, self.step_id, self.logical_attempt_id, self.event_type, self.plan_version
            )
            object.__setattr__(self, "idempotency_key", key)
        if self.event_id is None:
            object.__setattr__(self, "event_id", str(uuid.uuid4()))


@dataclass(frozen=True)
class StoredEvent:
    """An event as persisted: every NewEvent field plus `run_seq` and `persisted_at`.
    UUID fields are canonical lowercase strings; `idempotency_key` is always set."""

    run_id: str
    run_seq: int
    event_type: str
    emitted_at: datetime
    persisted_at: datetime
    idempotency_key: str
    event_id: str
    data: Any = None
    step_id: str | None = None
    engine_attempt_id: str | None = None
    logical_attempt_id: str | None = None
    plan_version: str | None = None
    caused_by_signal_id: str | None = None
    parent_event_id: str | None = None
    adapter_version: str | None = None
    engine_run_ref: Any = None
    position: int | None = None  # the event's place in the global feed (fetch_all); None where not kept


@dataclass(frozen=True)
class AppendResult:
    run_seq: int
    idempotent: bool
    persisted: bool


@dataclass(frozen=True)
class StepState:
    status: str
    attempts: int = 0
    started_at: datetime | None = None
    completed_at: datetime | None = None
    error: Any = None


@dataclass(frozen=True)
class RunSnapshot:
    """The projected state of one run: a pure fold of its events (see projection.py)."""

    run_id: str
    status: str = "PENDING"
    started_at: datetime | None = None
    completed_at: datetime | None = None
    last_event_seq: int = 0
    steps: Mapping[str, StepState] = field(default_factory=dict)
    artifacts: tuple[Any, ...] = ()
    version: int = 0

    @classmethod
    def empty(cls, run_id: str) -> RunSnapshot:
        return cls(run_id=run_id)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (datetimes as ISO 8601). `version` is storage metadata, kept out."""
        return {
            "runId": self.run_id,
            "status": self.status,
            "startedAt": _iso(self.started_at),
            "completedAt": _iso(self.completed_at),
            "lastEventSeq": self.last_event_seq,
            "steps": {
                step_id: {
                    "status": step.status,
                    "attempts": step.attempts,
                    "startedAt": _iso(step.started_at),
                    "completedAt": _iso(step.completed_at),
                    "error": step.error,
                }
                for step_id, step in sorted(self.steps.items())
            },
            "artifacts": list(self.artifacts),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], *, version: int = 0) -> RunSnapshot:
        return cls(
            run_id=doc["runId"],
            status=doc.get("status", "PENDING"),
            started_at=_from_iso(doc.get("startedAt")),
            completed_at=_from_iso(doc.get("completedAt")),
            last_event_seq=int(doc.get("lastEventSeq", 0)),
            steps={
                step_id: StepState(
                    status=step["status"],
                    attempts=int(step.get("attempts", 0)),
                    started_at=_from_iso(step.get("startedAt")),
                    completed_at=_from_iso(step.get("completedAt")),
                    error=step.get("error"),
                )
                for step_id, step in doc.get("steps", {}).items()
            },
            artifacts=tuple(doc.get("artifacts", ())),
            version=version,
        )

    def with_version(self, version: int) -> RunSnapshot:
        return replace(self, version=version)

    def same_state(self, other: RunSnapshot) -> bool:
        """Equal apart from the storage `version`."""
        return self.to_dict() == other.to_dict()


@dataclass(frozen=True)
class ProjectionReport:
    """What project_runs did: runs looked at, runs whose stored snapshot changed, events folded."""

    runs_projected: int
    runs_changed: int
    events_applied: int
    failed: tuple[tuple[str, str], ...] = ()  # (run_id, error) of the runs that could not be projected


@dataclass(frozen=True)
class MigrationReport:
    """What migrate_events copied and how it verified the copy."""

    runs: int
    events_read: int
    events_written: int
    events_skipped: int
    verified: bool
    mismatches: list[str] = field(default_factory=list)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _from_iso(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def one_line(exc: BaseException) -> str:
    """A driver error's message on one line, for an EventStoreError naming what failed."""
    return " ".join(str(exc).split()) or type(exc).__name__
