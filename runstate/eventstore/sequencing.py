"""Per-run sequence numbers: which events of a batch are new, and the run_seq each one gets.

Pure functions over what the store read inside its transaction (the run's last_seq and the idempotency
keys already stored), and Batch, the one-flight append's numbering of a batch before it knows the last_seq:
every append and import numbers through them, on every backend.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from runstate.eventstore.contract import AppendResult, ConcurrencyConflict, EventStoreError, StoredEvent
from runstate.eventstore.validation import ValidEvent


@dataclass
class Batch:
    """A batch as it is validated, part by part: its events, the distinct new ones in order, and for
    each event its 1-based place among them and whether it repeats a key earlier in the batch (the
    one-flight append numbers the new ones after the run's last seq, and answers the repeats from them)."""

    valid: list[ValidEvent] = field(default_factory=list)
    new: list[ValidEvent] = field(default_factory=list)
    places: list[tuple[int, bool]] = field(default_factory=list)
    _place_of: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, valid: list[ValidEvent]) -> Batch:
        return cls().extended(valid)

    def extended(self, valid: list[ValidEvent]) -> Batch:
        batch = Batch(self.valid + valid, list(self.new), list(self.places), dict(self._place_of))
        for event in valid:
            place = batch._place_of.get(event.idempotency_key)
            if place is None:
                batch.new.append(event)
                place = batch._place_of[event.idempotency_key] = len(batch.new)
                batch.places.append((place, False))
            else:
                batch.places.append((place, True))
        return batch

    def results(self, before: int) -> list[AppendResult]:
        """The batch's results once its new events were stored after seq `before`."""
        return [AppendResult(before + place, idempotent=dup, persisted=not dup) for place, dup in self.places]


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
