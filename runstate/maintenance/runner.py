"""The fenced job runner and the worker.

`run_job` runs one claimed job: the job's table lock (taken under the claim's fence), a heartbeat
thread, the actions of its plan in order with the table's figures around each, and the completion
under the fence. Its Spark work runs in the worker's session, whose catalog commits are fenced in
Postgres (commit_fence.py). A `QueueWorker` claims jobs one after another on one such session; its
`run()` hands each outcome to the caller, which logs it and decides whether the worker claims another.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runstate.maintenance.actions import CATALOG, ActionResult, ActionRunner
from runstate.maintenance.commit_fence import forget_table, worker_session, worker_tag
from runstate.maintenance.errors import InvalidActionOption, TableLocked
from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.models import Claim
from runstate.maintenance.options import ActionSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from runstate.maintenance.store import MaintenanceStore

log = logging.getLogger(__name__)


@dataclass
class JobOutcome:
    job_id: str
    attempt_id: str
    ref: TableRef
    status: str  # completed | failed | cancelled | fenced_out
    results: list[ActionResult] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def of(cls, claim: Claim, status: str) -> JobOutcome:
        return cls(claim.job_id, claim.attempt_id, claim.ref, status)

    @property
    def completed_actions(self) -> list[str]:
        return [r.action for r in self.results if r.success]


class LeaseKeeper:
    """A thread that heartbeats the claim and refreshes its table lock until stopped or fenced out."""

    def __init__(
        self,
        store: MaintenanceStore,
        claim: Claim,
        *,
        interval_seconds: float,
        lease_seconds: float,
        lock_ttl_seconds: float,
    ) -> None:
        self.store, self.claim = store, claim
        self.interval, self.lease_seconds, self.lock_ttl = interval_seconds, lease_seconds, lock_ttl_seconds
        self.fenced_out = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"lease-{claim.job_id}", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                alive = self.store.queue.heartbeat(self.claim, self.lease_seconds)
                alive = alive and self.store.locks.lock_for_claim(self.claim, self.lock_ttl)
            except Exception:  # noqa: BLE001 - a database blip; the next beat retries, the lease has slack
                log.exception("heartbeat for job %s failed", self.claim.job_id)
                continue
            if not alive:
                self.fenced_out.set()
                return

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def fenced_session(
    spark: SparkSession, store: MaintenanceStore, worker: str, catalog: str = CATALOG
) -> Iterator[SparkSession]:
    """The Spark session `worker` runs its jobs in, with the commit fence installed in front of it."""
    store.ensure_commit_fence()
    with worker_session(spark, catalog, worker_tag(store.schema, worker)) as session:
        yield session


def run_job(
    spark: SparkSession,
    store: MaintenanceStore,
    claim: Claim,
    *,
    session: SparkSession | None = None,
    settings: ActionSettings | None = None,
    catalog: str = CATALOG,
    lock_ttl_seconds: float | None = None,
    heartbeat_seconds: float | None = None,
    after_action: Callable[[ActionResult], None] | None = None,
) -> JobOutcome:
    """Run a claimed job: hold the table lock, heartbeat, run its plan's actions in order, complete under
    the fence. `settings` are the worker's defaults, under the options of the job's plan.

    `session` is the claim's worker's fenced_session (a QueueWorker keeps one across jobs); without it
    the job opens one of its own. Stops between actions when the job is cancelled or the claim is fenced
    out; a commit attempted after the fence was lost is refused by the catalog. Raises TableLocked
    (nothing run, nothing recorded) when another job holds the table; the lease then expires and the
    job is claimed again later, or fails at its maximum attempts. The lock lives as long as the lease
    unless told otherwise.
    """
    job = functools.partial(
        _run_claimed,
        spark,
        store,
        claim,
        settings=settings,
        catalog=catalog,
        lock_ttl_seconds=lock_ttl_seconds,
        heartbeat_seconds=heartbeat_seconds,
        after_action=after_action,
    )
    if session is not None:
        return job(session)
    with fenced_session(spark, store, claim.worker, catalog) as own_session:
        return job(own_session)


def _run_claimed(
    spark: SparkSession,
    store: MaintenanceStore,
    claim: Claim,
    session: SparkSession,
    *,
    settings: ActionSettings | None,
    catalog: str,
    lock_ttl_seconds: float | None,
    heartbeat_seconds: float | None,
    after_action: Callable[[ActionResult], None] | None,
) -> JobOutcome:
    lease_seconds = float(claim.lease_seconds)
    lock_ttl = float(lock_ttl_seconds) if lock_ttl_seconds is not None else lease_seconds
    try:
        job_settings = claim.plan.settings(settings)
    except InvalidActionOption as error:  # a row stored before options were checked at submit
        outcome = JobOutcome.of(claim, "failed")
        outcome.error = f"job {claim.job_id}: its stored options are invalid: {error}"
        if not store.queue.complete(claim, "failed", outcome.error):
            outcome.status = "fenced_out"
        return outcome
    if not store.locks.lock_for_claim(claim, lock_ttl):
        if not store.queue.holds_fence(claim):
            return JobOutcome.of(claim, "fenced_out")
        raise TableLocked(
            f"table {claim.ref.key} is locked by another maintenance job; job {claim.job_id} not run"
        )
    outcome = JobOutcome.of(claim, "completed")
    # Three beats per lease: one lost beat never costs the claim.
    interval = heartbeat_seconds or max(lease_seconds / 3, 0.05)
    try:
        with LeaseKeeper(
            store,
            claim,
            interval_seconds=interval,
            lease_seconds=lease_seconds,
            lock_ttl_seconds=lock_ttl,
        ) as keeper:
            runner = ActionRunner(session, claim.ref, job_settings, catalog=catalog)
            outcome.status = _run_actions(runner, store, claim, keeper, outcome, after_action)
        if outcome.status == "fenced_out":
            return outcome
        failures = [r.error for r in outcome.results if not r.success]
        if failures:
            outcome.status, outcome.error = "failed", "; ".join(e for e in failures if e)
        if not store.queue.complete(claim, outcome.status, outcome.error):
            outcome.status = "fenced_out"
        return outcome
    finally:
        store.locks.unlock_for_claim(claim)
        if session is not spark:
            forget_table(spark, catalog, claim.ref)


def _run_actions(
    runner: ActionRunner,
    store: MaintenanceStore,
    claim: Claim,
    keeper: LeaseKeeper,
    outcome: JobOutcome,
    after_action: Callable[[ActionResult], None] | None,
) -> str:
    # The health row the orchestrator just stored answers the first figures when the table has not
    # changed since (same snapshot): no Spark job before the first action.
    runner.refresh_table()  # the worker's session may hold the table as an earlier job left it
    plan = claim.plan
    figures = None if plan.dry_run else runner.figures(known=store.history.latest_health(claim.ref))
    for action in plan.actions:
        # A beat right before each action: a worker whose lease ran out never starts another procedure.
        if keeper.fenced_out.is_set() or not store.queue.heartbeat(claim, keeper.lease_seconds):
            return "fenced_out"
        if store.queue.is_cancel_requested(claim):
            return "cancelled"
        result = runner.run(action, dry_run=plan.dry_run, before=figures)
        outcome.results.append(result)
        if result.after:
            figures = result.after
        if not store.queue.record_action(
            claim,
            result.action,
            result.success,
            result.message,
            result.error,
            result.elapsed_seconds,
            before=result.before,
            after=result.after,
        ):
            return "fenced_out"
        if after_action is not None:
            after_action(result)
    # A cancel that arrives after the last action is too late to stop anything: the job did complete.
    return "completed"


@dataclass
class WorkerReport:
    """What a worker ran: one entry per claimed job (TableLocked ones included)."""

    outcomes: list[JobOutcome] = field(default_factory=list)
    locked: list[str] = field(default_factory=list)
    elapsed_seconds: float = 0.0

    def count(self, status: str) -> int:
        return sum(1 for outcome in self.outcomes if outcome.status == status)


class QueueWorker:
    """A worker named `name`: claims jobs one after another and runs each (`run_job`) on one fenced
    Spark session of its own, on one pinned Postgres connection.

    `run()` yields each job's outcome to its caller, which reports it and decides whether to go on: the
    next job is claimed only when the next outcome is asked for, so a caller told to stop (a stop
    request, a run declared dead) asks for no more. `report` sums up what the latest run() ran.
    """

    def __init__(
        self,
        store: MaintenanceStore,
        name: str,
        *,
        lease_seconds: float,
        settings: ActionSettings | None = None,
        lock_ttl_seconds: float | None = None,
        heartbeat_seconds: float | None = None,
        catalog: str = CATALOG,
    ) -> None:
        self.store, self.name, self.lease_seconds = store, name, lease_seconds
        self.settings, self.catalog = settings, catalog
        self.lock_ttl_seconds, self.heartbeat_seconds = lock_ttl_seconds, heartbeat_seconds
        self.report = WorkerReport()

    def run(
        self,
        spark: SparkSession | Callable[[], SparkSession],
        *,
        budget_seconds: float,
        max_jobs: int | None = None,
    ) -> Iterator[JobOutcome]:
        """Claim and run jobs until the queue is empty, the time budget is spent (checked before each
        claim, so a job is never cut short) or `max_jobs` ran; yields each job's outcome.

        `spark` may be a factory (a resource's `get_session`): then the session (a JVM) starts only once
        a job was claimed. Close the iterator when stopping early (`contextlib.closing`): that ends
        the worker's session and gives its connection back.
        """
        started = time.monotonic()
        report = self.report = WorkerReport()
        try:
            with ExitStack() as held:
                held.enter_context(self.store.pinned())  # the loop's statements on one connection
                base = session = None
                while time.monotonic() - started < budget_seconds and (
                    max_jobs is None or len(report.outcomes) < max_jobs
                ):
                    claim = self.store.queue.claim(self.name, self.lease_seconds)
                    if claim is None:
                        return
                    if session is None:
                        base = spark if hasattr(spark, "sql") else spark()
                        session = held.enter_context(
                            fenced_session(base, self.store, self.name, self.catalog)
                        )
                    try:
                        outcome = run_job(
                            base,
                            self.store,
                            claim,
                            session=session,
                            settings=self.settings,
                            catalog=self.catalog,
                            lock_ttl_seconds=self.lock_ttl_seconds,
                            heartbeat_seconds=self.heartbeat_seconds,
                        )
                    except TableLocked as exc:
                        # Its lease expires and another worker (or this one, later) claims it again.
                        log.warning("%s", exc)
                        report.locked.append(claim.job_id)
                        continue
                    report.outcomes.append(outcome)
                    yield outcome
        finally:
            report.elapsed_seconds = time.monotonic() - started

    def drain(
        self,
        spark: SparkSession | Callable[[], SparkSession],
        *,
        budget_seconds: float,
        max_jobs: int | None = None,
    ) -> WorkerReport:
        """`run()` to its end, for a caller with nothing to do between jobs (a script, a benchmark)."""
        for _ in self.run(spark, budget_seconds=budget_seconds, max_jobs=max_jobs):
            pass
        return self.report
