"""The projector: each run's stored RunSnapshot (run_snapshots), kept up to date incrementally, and resume.

A piece of the EventStore with one job (as Marten's projections are): it folds a run's events onto its
stored projection and saves the result with a compare-and-set on `version`, retrying on a fresh read
when another projector won; it finds the projection a snapshot holds, and where a resume starts. It reads
and writes only through the store's backend.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence

from runstate.eventstore.backend import StoreBackend, Tx
from runstate.eventstore.contract import (
    ConcurrencyConflict,
    EventStoreError,
    ProjectionReport,
    RunSnapshot,
    StoredEvent,
)
from runstate.eventstore.hints import fold_new
from runstate.eventstore.projection import fold
from runstate.eventstore.resume import Resume
from runstate.eventstore.snapshots import KIND_PROJECTION, SnapshotMetrics, SnapshotPolicy, choose_valid
from runstate.eventstore.validation import ValidEvent

log = logging.getLogger("runstate.eventstore")

_PAGE = 10_000
_MAX_PROJECTION_ATTEMPTS = 20

# (the snapshot, whether it moved, how many events were folded)
_Projected = tuple[RunSnapshot, bool, int]


class Projector:
    def __init__(
        self,
        backend: StoreBackend,
        metrics: SnapshotMetrics,
        policy: SnapshotPolicy,
        fetch: Callable[..., list[StoredEvent]] | None = None,
    ):
        self.backend = backend
        self.metrics = metrics
        self.policy = policy
        # A page of a run's events (tx, run_id, after_seq, limit, upto): the store's, which reads a run
        # archived to the lake from there (lake_archive.py); the backend's fetch by default.
        self.fetch = fetch or backend.fetch

    def fetch_run(self, tx: Tx, run_id: str, after_seq: int, upto: int | None = None) -> list[StoredEvent]:
        """Every event of the run with after_seq < run_seq <= upto, page by page."""
        events: list[StoredEvent] = []
        while True:
            page = self.fetch(tx, run_id, after_seq, _PAGE, upto)
            events.extend(page)
            if len(page) < _PAGE:
                return events
            after_seq = page[-1].run_seq

    def projection_at(
        self,
        tx: Tx,
        run_id: str,
        upto: int,
        pending: Sequence[tuple[int, ValidEvent]],
        recalled: RunSnapshot | None,
    ) -> RunSnapshot:
        """The run's projection through its stored events up to `upto` plus `pending` ones (a snapshot's,
        inside the append's transaction): from `recalled`, the store's last projection of the run, when it
        is not past `upto`, else from the best one stored."""
        if upto == 0:  # a new run: nothing stored to start from (and no round trip to find that out)
            base = RunSnapshot.empty(run_id)
        elif recalled is not None and recalled.last_event_seq <= upto:
            base = recalled
        else:
            base = self._stored_upto(tx, run_id, upto)
        if base.last_event_seq != upto:
            base = fold(base, self.fetch_run(tx, run_id, base.last_event_seq, upto=upto))
        return fold_new(base, pending)

    def _stored_upto(self, tx: Tx, run_id: str, upto: int) -> RunSnapshot:
        """The newest valid projection snapshot at most `upto`, or the stored projection when that is
        further on and not past `upto`; empty when neither."""
        chosen = choose_valid(
            run_id, self.backend.snapshots(tx, run_id, upto=upto, kind=KIND_PROJECTION), self.metrics
        )
        best = (
            RunSnapshot.from_dict(chosen.state)
            if chosen.kind == KIND_PROJECTION
            else RunSnapshot.empty(run_id)
        )
        stored = self.backend.stored_projection(tx, run_id)
        if stored is not None and best.last_event_seq < stored.last_event_seq <= upto:
            best = stored
        return best

    def project(self, run_id: str) -> RunSnapshot:
        return self._until_saved("project", self._project_once, run_id)[0]

    def rebuild(self, run_id: str) -> RunSnapshot:
        return self._until_saved("rebuild", self._rebuild_once, run_id)[0]

    def project_runs(self, run_ids: Iterable[str], *, rebuild: bool = False) -> ProjectionReport:
        """project (or rebuild) each run; counts for the Dagster asset's metadata. A run that cannot
        be projected (an unreadable event, say) is reported in `failed` and the others carry on."""
        attempt = self._rebuild_once if rebuild else self._project_once
        runs = changed = applied = 0
        failed: list[tuple[str, str]] = []
        for run_id in run_ids:
            try:
                _, moved, folded = self._until_saved("rebuild" if rebuild else "project", attempt, run_id)
            except EventStoreError as exc:
                log.warning("run %r: projection failed, skipped: %s", run_id, exc)
                failed.append((run_id, str(exc)))
                continue
            runs, changed, applied = runs + 1, changed + moved, applied + folded
        return ProjectionReport(
            runs_projected=runs, runs_changed=changed, events_applied=applied, failed=tuple(failed)
        )

    def _until_saved(
        self, what: str, attempt: Callable[[Tx, str], _Projected | None], run_id: str
    ) -> _Projected:
        """Retry a compare-and-set projection step on a fresh read until it wins."""
        for tries in range(_MAX_PROJECTION_ATTEMPTS):
            done = self.backend.run(
                f"{what} run {run_id!r}", lambda tx: attempt(tx, run_id), transactional=False
            )
            if done is not None:
                return done
            time.sleep(min(0.2, 0.002 * 2**tries) * random.random())  # another projector won: let it finish
        raise ConcurrencyConflict(f"{what} run {run_id!r}: the stored snapshot kept changing")

    def _project_once(self, tx: Tx, run_id: str) -> _Projected | None:
        """One optimistic projection attempt; None when another projector moved the version."""
        stored = self.backend.stored_projection(tx, run_id)
        base = stored or RunSnapshot.empty(run_id)
        events = self.fetch_run(tx, run_id, base.last_event_seq)
        if not events:
            return base, False, 0
        updated = fold(base, events)
        if not self.backend.save_projection(tx, run_id, updated, stored):
            return None
        return updated.with_version(base.version + 1), True, len(events)

    def _rebuild_once(self, tx: Tx, run_id: str) -> _Projected | None:
        """One optimistic rebuild attempt; None when another projector moved the version."""
        stored = self.backend.stored_projection(tx, run_id)
        events = self.fetch_run(tx, run_id, 0)
        fresh = fold(RunSnapshot.empty(run_id), events)
        if fresh.last_event_seq == 0 and stored is None:
            return fresh, False, 0
        if stored is not None and stored.same_state(fresh):
            return stored, False, len(events)
        if not self.backend.save_projection(tx, run_id, fresh, stored):
            return None
        return fresh.with_version((stored.version if stored else 0) + 1), True, len(events)

    def resume(self, run_id: str) -> Resume:
        """The latest valid state snapshot plus the events after it (older / full replay on corruption),
        counted in the metrics (and a missing snapshot when the full replay was long)."""
        started = time.perf_counter()

        def work(tx: Tx) -> Resume:
            chosen = choose_valid(run_id, self.backend.snapshots(tx, run_id), self.metrics)
            events = self.fetch_run(tx, run_id, chosen.seq)
            return Resume(chosen.state, chosen.seq, events, chosen.kind, chosen.fallbacks)

        result = self.backend.run(f"resume run {run_id!r}", work, transactional=False)
        if result.snapshot_seq == 0 and not result.fallbacks and len(result.events) >= self.policy.interval:
            self.metrics.record_missing(run_id, len(result.events), self.policy.interval)
        self.metrics.record_resume(result.snapshot_seq, len(result.events), time.perf_counter() - started)
        return result
