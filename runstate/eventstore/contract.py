"""The event store contract: events in, stored events and snapshots out, validated at the edge.

Plain Python only (no dagster, no drivers): both backends and the Dagster shell build on it.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Iterable, Mapping, Protocol, Sequence, runtime_checkable

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
    """Base for event store failures that are not bad input."""


class InvalidEvent(ValueError):
    """An event failed validation; `field` names the offending field. Nothing was written."""

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
    """Optimistic concurrency gave up after its retries (another writer kept winning)."""


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
    def empty(cls, run_id: str) -> "RunSnapshot":
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
    def from_dict(cls, doc: Mapping[str, Any], *, version: int = 0) -> "RunSnapshot":
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

    def with_version(self, version: int) -> "RunSnapshot":
        return replace(self, version=version)

    def same_state(self, other: "RunSnapshot") -> bool:
        """Equal apart from the storage `version`."""
        return self.to_dict() == other.to_dict()


@dataclass(frozen=True)
class Resume:
    """What a worker needs to continue a run: the latest valid snapshot state (None on a full
    replay), the run_seq it was taken at (0 on a full replay) and the events after it.

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
        from runstate.eventstore.projection import fold

        if self.kind == "projection":
            base = RunSnapshot.from_dict(self.state)
        elif self.kind == "none":
            base = RunSnapshot.empty(run_id)
        else:
            raise ValueError(f"run {run_id!r}: snapshot at seq {self.snapshot_seq} holds caller state, not a projection")
        return fold(base, self.events)


@dataclass(frozen=True)
class ProjectionReport:
    """What project_runs did: runs looked at, runs whose stored snapshot changed, events folded."""

    runs_projected: int
    runs_changed: int
    events_applied: int


@dataclass(frozen=True)
class MigrationReport:
    """What migrate_events copied and how it verified the copy."""

    runs: int
    events_read: int
    events_written: int
    events_skipped: int
    verified: bool
    mismatches: list[str] = field(default_factory=list)


@runtime_checkable
class EventStore(Protocol):
    """What both backends provide (see DESIGN.md, "Event store")."""

    snapshot_interval: int

    def ensure_schema(self) -> None: ...

    def append(self, event: NewEvent) -> AppendResult: ...

    def append_batch(self, run_id: str, events: Sequence[NewEvent], state: Any = None) -> list[AppendResult]: ...

    def fetch(self, run_id: str, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]: ...

    def project(self, run_id: str) -> RunSnapshot: ...

    def rebuild(self, run_id: str) -> RunSnapshot: ...

    def resume(self, run_id: str) -> Resume: ...

    def checkpoint(self, run_id: str, state: Any = None) -> int: ...

    def archive(self, older_than_days: int, now: datetime | None = None) -> int: ...

    def import_events(self, events: Iterable[StoredEvent]) -> int: ...

    def run_ids(self, after: str = "", limit: int = 1000) -> list[str]: ...

    def max_seq(self, run_id: str) -> int: ...

    def stale_runs(self, limit: int = 1000) -> list[str]: ...

    def stale_runs_with_start(self, limit: int = 1000) -> list[tuple[str, datetime | None, int]]: ...

    def project_runs(self, run_ids: Iterable[str], *, rebuild: bool = False) -> "ProjectionReport": ...

    def runs_started_between(self, start: datetime, end: datetime) -> list[str]: ...

    def close(self) -> None: ...


# -- validation -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ValidEvent:
    """A NewEvent that passed validation, with its JSON already encoded (stores bind these)."""

    run_id: str
    event_type: str
    emitted_at: datetime
    data_json: str | None
    step_id: str | None
    engine_attempt_id: str | None
    logical_attempt_id: str | None
    plan_version: str | None
    event_id: str
    idempotency_key: str
    caused_by_signal_id: str | None
    parent_event_id: str | None
    adapter_version: str | None
    engine_run_ref_json: str | None


def validate_event(
    event: NewEvent, *, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES, index: int | None = None
) -> ValidEvent:
    """Check one event at the edge; raise InvalidEvent naming the field, touching nothing."""
    if not isinstance(event, NewEvent):
        raise InvalidEvent("event", f"expected a NewEvent, got {type(event).__name__}", index=index)
    run_id = event.run_id
    if not isinstance(run_id, str) or not run_id:
        raise InvalidEvent("run_id", "must be a non-empty string", index=index)
    if len(run_id) > MAX_RUN_ID_CHARS:
        raise InvalidEvent("run_id", f"is {len(run_id)} characters; at most {MAX_RUN_ID_CHARS}", index=index)
    if "\x00" in run_id or not _utf8(run_id):
        raise InvalidEvent("run_id", "must be valid UTF-8 without NUL", index=index)

    def bad(field_name: str, message: str) -> InvalidEvent:
        return InvalidEvent(field_name, message, run_id=run_id, index=index)

    if not isinstance(event.event_type, str) or not event.event_type.strip():
        raise bad("event_type", "must be a non-empty string")
    if "\x00" in event.event_type or not _utf8(event.event_type) or len(event.event_type) > 256:
        raise bad("event_type", "must be valid UTF-8 without NUL, at most 256 characters")
    if not isinstance(event.emitted_at, datetime):
        raise bad("emitted_at", f"must be a datetime, got {type(event.emitted_at).__name__}")
    if event.emitted_at.tzinfo is None or event.emitted_at.utcoffset() is None:
        raise bad("emitted_at", "must be timezone-aware")
    for name in ("step_id", "engine_attempt_id", "logical_attempt_id", "plan_version", "adapter_version"):
        value = getattr(event, name)
        if value is not None and not isinstance(value, str):
            raise bad(name, f"must be a string or None, got {type(value).__name__}")
        if value is not None and ("\x00" in value or not _utf8(value)):
            raise bad(name, "must be valid UTF-8 without NUL")
    key = event.idempotency_key
    if not isinstance(key, str) or not key or len(key) > 512 or "\x00" in key or not _utf8(key):
        raise bad("idempotency_key", "must be a non-empty string of at most 512 characters")
    data_json = _encode_json(event.data, "data", bad, max_event_bytes)
    ref_json = _encode_json(event.engine_run_ref, "engine_run_ref", bad, max_event_bytes)
    return ValidEvent(
        run_id=run_id,
        event_type=event.event_type,
        emitted_at=event.emitted_at,
        data_json=data_json,
        step_id=event.step_id,
        engine_attempt_id=event.engine_attempt_id,
        logical_attempt_id=event.logical_attempt_id,
        plan_version=event.plan_version,
        event_id=_uuid_text(event.event_id, "event_id", bad, required=True),
        idempotency_key=key,
        caused_by_signal_id=_uuid_text(event.caused_by_signal_id, "caused_by_signal_id", bad),
        parent_event_id=_uuid_text(event.parent_event_id, "parent_event_id", bad),
        adapter_version=event.adapter_version,
        engine_run_ref_json=ref_json,
    )


def validate_batch(
    run_id: str, events: Sequence[NewEvent], *, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
) -> list[ValidEvent]:
    """Validate a whole batch before any write: one bad event rejects the batch."""
    if not isinstance(run_id, str) or not run_id or len(run_id) > MAX_RUN_ID_CHARS:
        raise InvalidEvent("run_id", f"batch run_id must be a non-empty string of at most {MAX_RUN_ID_CHARS} characters")
    valid = []
    for index, event in enumerate(events):
        checked = validate_event(event, max_event_bytes=max_event_bytes, index=index)
        if checked.run_id != run_id:
            raise InvalidEvent("run_id", f"is {checked.run_id!r} but the batch is for run {run_id!r}", index=index)
        valid.append(checked)
    return valid


def _encode_json(value: Any, field_name: str, bad, max_bytes: int) -> str | None:
    if value is None:
        return None
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise bad(field_name, f"is not JSON-serialisable ({exc})") from None
    if "\\u0000" in text:
        raise bad(field_name, "must not contain NUL characters (JSONB rejects them)")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise bad(field_name, "contains text that is not valid UTF-8 (a lone surrogate?)") from None
    if size > max_bytes:
        raise bad(field_name, f"is {size} bytes as JSON; the limit is {max_bytes}")
    return text


def _uuid_text(value: Any, field_name: str, bad, *, required: bool = False) -> str | None:
    if value is None:
        if required:
            raise bad(field_name, "is required")
        return None
    if isinstance(value, uuid.UUID):
        return str(value)
    if not isinstance(value, str):
        raise bad(field_name, f"must be a UUID, got {type(value).__name__}")
    if _CANONICAL_UUID.fullmatch(value):
        return value  # already str(uuid.UUID(value)) (NewEvent's default): skip parsing it per event
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise bad(field_name, f"{value[:64]!r} is not a valid UUID") from None


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _utf8(text: str) -> bool:
    if text.isascii():  # the common case, and ASCII always encodes
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _from_iso(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


