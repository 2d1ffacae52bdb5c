"""Per-run sequence numbers: which events of a batch are new, and the run_seq each one gets.

Pure functions over what a backend read inside its transaction (the run's last_seq and the idempotency
keys already stored); both backends' append and import call them, so the two cannot number differently.
"""

from __future__ import annotations

from collections.abc import Iterable

from runstate.eventstore.contract import AppendResult, ConcurrencyConflict, EventStoreError, StoredEvent
from runstate.eventstore.validation import ValidEvent


def check_expected(
    run_id: str, valid: list[ValidEvent], known: dict[str, int], last_seq: int, expected: int | None
) -> None:
    """Optimistic concurrency: the run must be at `expected`, unless every event is already stored
    (a pure retry of an append that won, which then returns the stored results)."""
    if expected is None or last_seq == expected:
        return
    if all(event.idempotency_key in known for event in valid):
        return
    raise ConcurrencyConflict.stale(run_id, expected, last_seq)


def assign_seqs(
    valid: list[ValidEvent], known: dict[str, int], last_seq: int
) -> tuple[list[AppendResult], list[tuple[int, ValidEvent]], int]:
    """(results, new (run_seq, event) rows, the new last_seq): a key already stored or earlier in
    the batch keeps its run_seq; new events take the next ones after `last_seq` (adds to `known`)."""
    results: list[AppendResult] = []
    new: list[tuple[int, ValidEvent]] = []
    next_seq = last_seq
    for event in valid:
        if event.idempotency_key in known:
            results.append(AppendResult(known[event.idempotency_key], idempotent=True, persisted=False))
            continue
        next_seq += 1
        known[event.idempotency_key] = next_seq
        new.append((next_seq, event))
        results.append(AppendResult(next_seq, idempotent=False, persisted=True))
    return results, new, next_seq


def by_run(events: Iterable[StoredEvent]) -> dict[str, list[StoredEvent]]:
    """Imported events grouped by run, each run's in the order given."""
    grouped: dict[str, list[StoredEvent]] = {}
    for event in events:
        grouped.setdefault(event.run_id, []).append(event)
    return grouped


def fresh_imports(
    run_id: str, valid: list[tuple[int, ValidEvent]], keys: dict[str, int], taken: set[int]
) -> list[tuple[int, ValidEvent]]:
    """The imported (run_seq, event) rows not stored yet; a stored key at another run_seq, or a
    run_seq taken by another event, is an EventStoreError."""
    fresh = []
    for seq, event in valid:
        stored_at = keys.get(event.idempotency_key)
        if stored_at is not None:
            if stored_at != seq:
                raise EventStoreError(
                    f"run {run_id!r}: idempotency key {event.idempotency_key[:12]}.. is stored at run_seq "
                    f"{stored_at}, the import has it at {seq}"
                )
            continue
        if seq in taken:
            raise EventStoreError(f"run {run_id!r}: run_seq {seq} is already taken by a different event")
        fresh.append((seq, event))
    return fresh
