"""Jobs over the event store: append events (launchable from the UI launchpad) and archive old runs.

Ops are thin: they turn Pydantic config into core calls and log what happened. Bad input fails the
run with the core's `InvalidEvent` message (which names the field), without retries, and nothing
is written because the core validates the whole batch before its one transaction.
"""

from datetime import UTC, datetime
from typing import Any

import dagster as dg
from pydantic import Field

from runstate.defs.eventstore.resources import EventStoreResource
from runstate.defs.runs.interrupts import ends_run_when_interrupted
from runstate.defs.tags import DOMAIN_TAG, TABLE_TAG
from runstate.eventstore import (
    DEFAULT_ARCHIVE_AFTER_DAYS,
    ConcurrencyConflict,
    InvalidEvent,
    NewEvent,
)

RUN_EVENTS_ASSET = dg.AssetKey("run_events")
# Transient database errors are retried; appends are idempotent (deterministic idempotency keys).
STORE_RETRY_POLICY = dg.RetryPolicy(max_retries=3, delay=1.0, backoff=dg.Backoff.EXPONENTIAL)


class EventConfig(dg.Config):
    """One event as typed into the launchpad."""

    event_type: str = Field(
        description="RunStarted, StepStarted, StepCompleted, ... (other types are stored too)."
    )
    step_id: str | None = Field(default=None, description="The step the event belongs to.")
    data: dict[str, Any] | None = Field(default=None, description="The event payload (a JSON object).")
    emitted_at: str | None = Field(
        default=None, description="ISO 8601 with a UTC offset; defaults to the time of the append."
    )
    logical_attempt_id: str | None = None
    engine_attempt_id: str | None = None
    plan_version: str | None = None
    idempotency_key: str | None = Field(
        default=None,
        description="Defaults to sha256(run_id|step_id|logical_attempt_id|event_type|plan_version).",
    )
    event_id: str | None = Field(default=None, description="A UUID; a fresh one when empty.")


class AppendEventsConfig(dg.Config):
    """A batch of events for one run, appended atomically."""

    run_id: str = Field(description="The workflow run the events belong to (1..256 characters).")
    events: list[EventConfig] = Field(description="The events, in order.")
    expected_last_seq: int | None = Field(
        default=None,
        description="Optimistic concurrency: append only if the run's last seq is this (else the run fails).",
    )


class ArchiveConfig(dg.Config):
    older_than_days: int = Field(
        default=DEFAULT_ARCHIVE_AFTER_DAYS,
        description="Archive completed runs that ended more than N days ago.",
    )


def parse_emitted_at(value: str | None, index: int, run_id: str) -> datetime:
    """The launchpad gives strings; a bad one is an InvalidEvent on `emitted_at`, like the core's."""
    if value is None:
        return datetime.now(UTC)
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise InvalidEvent(
            "emitted_at", f"{value!r} is not an ISO 8601 timestamp", run_id=run_id, index=index
        ) from None


def to_new_events(config: AppendEventsConfig) -> list[NewEvent]:
    return [
        NewEvent(
            run_id=config.run_id,
            event_type=event.event_type,
            emitted_at=parse_emitted_at(event.emitted_at, index, config.run_id),
            data=event.data,
            step_id=event.step_id,
            logical_attempt_id=event.logical_attempt_id,
            engine_attempt_id=event.engine_attempt_id,
            plan_version=event.plan_version,
            idempotency_key=event.idempotency_key,
            event_id=event.event_id,
        )
        for index, event in enumerate(config.events)
    ]


def invalid_input_failure(exc: InvalidEvent) -> dg.Failure:
    """Bad input is not transient: fail at once with the field named, no retries."""
    return dg.Failure(
        description=f"invalid event, nothing written: {exc}",
        metadata={"field": exc.field, "index": exc.index if exc.index is not None else -1},
        allow_retries=False,
    )


def conflict_failure(exc: ConcurrencyConflict) -> dg.Failure:
    """Another writer moved the run: retrying the same expectation cannot win, so no retries."""
    return dg.Failure(
        description=f"nothing written: {exc}",
        metadata={"expected_last_seq": exc.expected, "actual_last_seq": exc.actual},
        allow_retries=False,
    )


@dg.op(retry_policy=STORE_RETRY_POLICY, tags={DOMAIN_TAG: "eventstore"})
@ends_run_when_interrupted
def append_events_op(
    context: dg.OpExecutionContext, config: AppendEventsConfig, event_store: EventStoreResource
) -> list[int]:
    """Append the configured events to their run in one transaction; returns their run_seqs."""
    try:
        events = to_new_events(config)
        results = event_store.get_store().append_batch(
            config.run_id, events, expected_last_seq=config.expected_last_seq
        )
    except InvalidEvent as exc:
        raise invalid_input_failure(exc) from exc
    except ConcurrencyConflict as exc:
        if exc.expected is None:
            raise  # lost races only: transient, the retry policy tries again
        raise conflict_failure(exc) from exc
    seqs = [result.run_seq for result in results]
    written = sum(1 for result in results if result.persisted)
    metadata = {
        "run_id": config.run_id,
        "events": len(results),
        "written": written,
        "duplicates": len(results) - written,
        "first_seq": min(seqs, default=0),
        "last_seq": max(seqs, default=0),
        "backend": event_store.backend,
    }
    context.log_event(dg.AssetMaterialization(asset_key=RUN_EVENTS_ASSET, metadata=metadata))
    context.add_output_metadata(metadata)
    return seqs


@dg.op(retry_policy=STORE_RETRY_POLICY, tags={DOMAIN_TAG: "eventstore"})
@ends_run_when_interrupted
def archive_events_op(
    context: dg.OpExecutionContext, config: ArchiveConfig, event_store: EventStoreResource
) -> int:
    """Move the events of completed runs older than N days to the archive (idempotent): the archive table,
    or with archive_to "lake" out of Postgres once the lake has them (runs it lacks fail the op after the
    others moved, naming them; a retry after the next export moves them)."""
    if config.older_than_days < 0:
        raise dg.Failure(
            description=f"older_than_days must be >= 0, got {config.older_than_days}", allow_retries=False
        )
    archived = event_store.get_store().archive(config.older_than_days)
    metadata = {
        "older_than_days": config.older_than_days,
        "events_archived": archived,
        "archive_to": event_store.archive_to,
    }
    context.log_event(dg.AssetObservation(asset_key=RUN_EVENTS_ASSET, metadata=metadata))
    context.add_output_metadata(metadata)
    return archived


@dg.job(
    description="Append a batch of run events (launch from the UI with config: run_id and events).",
    tags={DOMAIN_TAG: "eventstore"},
)
def append_events() -> None:
    append_events_op()


@dg.job(
    description="Archive the events of completed runs older than N days.",
    tags={DOMAIN_TAG: "eventstore", TABLE_TAG: "run_events"},
)
def archive_events() -> None:
    archive_events_op()
