"""The orchestrator: decide per cached table whether to submit maintenance, and audit the run.

Per table, in this order (the cheap checks first, so Spark only looks at candidates):
1. skip when the table is not opted in (`runstate.maintenance.enabled` is not true);
2. skip when it already has an active (pending or running) job;
3. skip when its last job was submitted within its cadence (`cadence-hours` 0: no minimum interval);
4. analyze health (and keep the snapshot); the thresholds' actions, then the table's own snapshot
   retention and the orphan-cleanup rule (rules.py) decide the job; a table with none is healthy;
5. a table with actions gets a job (with the options the rules chose), or only advice in dry-run mode.
Every run writes one orchestrator_runs row with all its counters, also when it fails.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from runstate.maintenance.errors import InvalidIdentifier, TableNotFound
from runstate.maintenance.identifiers import ACTIONS, APPLY_DELETES_OPTIONS, TableRef
from runstate.maintenance.models import HealthSnapshot, OrchestratorRun
from runstate.maintenance.plan import ActionPlan
from runstate.maintenance.rules import (
    DEFAULT_ORPHAN_INTERVAL_HOURS,
    DEFAULT_ORPHAN_MIN_AGE_HOURS,
    Retention,
    orphan_cleanup_due,
    orphan_min_age_hours,
    table_retention,
)

if TYPE_CHECKING:
    from runstate.maintenance.store import MaintenanceStore

log = logging.getLogger(__name__)

SKIPPED_NOT_OPTED_IN = "skipped_not_opted_in"
SKIPPED_ACTIVE_JOB = "skipped_active_job"
SKIPPED_CADENCE = "skipped_cadence"
SKIPPED_MISSING = "skipped_missing"
HEALTHY = "healthy"
SUBMITTED = "submitted"
ADVISED = "advised"
ERROR = "error"
SKIPS = (SKIPPED_NOT_OPTED_IN, SKIPPED_ACTIVE_JOB, SKIPPED_CADENCE, SKIPPED_MISSING)


@dataclass(frozen=True)
class OrchestratorSettings:
    dry_run: bool = False
    default_cadence_hours: int = 24
    record_health: bool = True
    orphan_min_age_hours: float = DEFAULT_ORPHAN_MIN_AGE_HOURS
    orphan_interval_hours: float = DEFAULT_ORPHAN_INTERVAL_HOURS
    # The retention of a table that sets none: expire_snapshots is submitted only when it would expire
    # something under it (too many snapshots that are all young is no job: it could change nothing).
    default_retention: Retention = Retention(older_than_hours=72.0, retain_last=10)


@dataclass
class TableDecision:
    table_key: str
    decision: str
    reason: str = ""
    job_id: str | None = None
    recommended_actions: list[str] = field(default_factory=list)


@dataclass
class OrchestratorReport:
    started_at: datetime
    completed_at: datetime | None = None
    status: str = "running"
    dry_run: bool = False
    decisions: list[TableDecision] = field(default_factory=list)
    jobs_completed: int = 0
    jobs_failed: int = 0
    error: str | None = None
    run_id: int | None = None

    def count(self, *decisions: str) -> int:
        return sum(1 for d in self.decisions if d.decision in decisions)

    @property
    def tables_assessed(self) -> int:
        return len(self.decisions)

    @property
    def tables_skipped(self) -> int:
        return self.count(*SKIPS)

    @property
    def tables_healthy(self) -> int:
        return self.count(HEALTHY)

    @property
    def jobs_submitted(self) -> int:
        return self.count(SUBMITTED)

    def as_run(self) -> OrchestratorRun:
        return OrchestratorRun(
            started_at=self.started_at,
            completed_at=self.completed_at or self.started_at,
            status=self.status,
            tables_assessed=self.tables_assessed,
            tables_skipped=self.tables_skipped,
            tables_healthy=self.tables_healthy,
            jobs_submitted=self.jobs_submitted,
            jobs_completed=self.jobs_completed,
            jobs_failed=self.jobs_failed,
            dry_run=self.dry_run,
            error=self.error,
        )

    def summary(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "dry_run": self.dry_run,
            "tables_assessed": self.tables_assessed,
            "tables_skipped": self.tables_skipped,
            "tables_healthy": self.tables_healthy,
            "jobs_submitted": self.jobs_submitted,
            "jobs_completed": self.jobs_completed,
            "jobs_failed": self.jobs_failed,
            "advised": self.count(ADVISED),
            "errors": self.count(ERROR),
        }


def _cadence_hours(entry: Any, default: int) -> int:
    payload = getattr(entry, "payload", None) or {}
    value = payload.get("maintenance_cadence_hours")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


class Orchestrator:
    def __init__(
        self,
        store: MaintenanceStore,
        analyze: Callable[[TableRef], HealthSnapshot],
        settings: OrchestratorSettings | None = None,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.analyze = analyze
        self.settings = settings or OrchestratorSettings()
        self.now = now

    def run(self) -> OrchestratorReport:
        report = OrchestratorReport(started_at=self.now(), dry_run=self.settings.dry_run)
        try:
            for entry in self.store.cache.cached_tables():
                report.decisions.append(self.decide(entry))
            self._count_finished_jobs(report)
            report.status = "completed_with_errors" if report.count(ERROR) else "completed"
            errors = [f"{d.table_key}: {d.reason}" for d in report.decisions if d.decision == ERROR]
            report.error = "; ".join(errors) or None
        except Exception as exc:
            report.status, report.error = "failed", f"{type(exc).__name__}: {exc}"
            raise
        finally:
            report.completed_at = self.now()
            report.run_id = self.store.history.record_orchestrator_run(report.as_run())
        return report

    def decide(self, entry: Any) -> TableDecision:
        key = f"{entry.database}.{entry.table}"
        if entry.maintenance_enabled is not True:
            return TableDecision(key, SKIPPED_NOT_OPTED_IN, "runstate.maintenance.enabled is not true")
        try:
            ref = TableRef(entry.database, entry.table)
        except InvalidIdentifier as exc:
            return TableDecision(key, ERROR, str(exc))
        active = self.store.queue.active_job(ref)
        if active is not None:
            return TableDecision(
                key, SKIPPED_ACTIVE_JOB, f"job {active.job_id} is {active.status}", active.job_id
            )
        cadence = _cadence_hours(entry, self.settings.default_cadence_hours)
        last = self.store.queue.last_cadence_job(ref) if cadence else None
        if last and last.submitted_at > self.now() - timedelta(hours=cadence):
            return TableDecision(
                key, SKIPPED_CADENCE, f"last job {last.job_id} within {cadence} h", last.job_id
            )
        try:
            return self._assess(ref, dict((getattr(entry, "payload", None) or {}).get("properties") or {}))
        except TableNotFound as exc:
            return TableDecision(key, SKIPPED_MISSING, str(exc))
        except Exception as exc:  # noqa: BLE001 - one table's failure must not stop the others
            log.exception("orchestrator: assessing %s failed", key)
            return TableDecision(key, ERROR, f"{type(exc).__name__}: {exc}")

    def _assess(self, ref: TableRef, properties: dict[str, Any]) -> TableDecision:
        key = ref.key
        health = self.analyze(ref)
        if self.settings.record_health:
            self.store.history.insert_health_snapshot(health)
        actions, options = self._plan(ref, health, properties)
        if not actions and health.error:
            # Nothing found wrong, but not everything could be measured: not evidence of health.
            return TableDecision(key, ERROR, f"health incomplete: {health.error}")
        if not actions:
            return TableDecision(key, HEALTHY, health.health_status)
        if self.settings.dry_run:
            return TableDecision(key, ADVISED, "dry run: advisory only", None, actions)
        job_id = self.store.queue.submit(ref, ActionPlan.parse(actions, options=options))
        return TableDecision(key, SUBMITTED, health.health_status, job_id, actions)

    def _plan(
        self, ref: TableRef, health: HealthSnapshot, properties: dict[str, Any]
    ) -> tuple[list[str], dict]:
        """The health thresholds' actions, with the table's own retention and the orphan rule applied."""
        wanted = set(health.recommended_actions)
        options: dict[str, Any] = {}
        if health.total_delete_files and "rewrite_data_files" in wanted:
            options.update(APPLY_DELETES_OPTIONS)
        # A table's own retention decides when and what to expire; otherwise the thresholds decide when
        # and the default retention what. Either way only when the oldest snapshot would go: a job
        # that can expire nothing (many snapshots, all young) is not submitted.
        retention = table_retention(properties)
        asked = retention.due(health) if retention else "expire_snapshots" in wanted
        retention = retention or self.settings.default_retention
        wanted.discard("expire_snapshots")
        if asked and retention.due(health):
            wanted.add("expire_snapshots")
            options.update(retention.options())
        min_age = orphan_min_age_hours(properties, self.settings.orphan_min_age_hours)
        last = self.store.queue.last_action_at(ref, "remove_orphan_files")
        if orphan_cleanup_due(health, last, self.now(), min_age, self.settings.orphan_interval_hours):
            wanted.add("remove_orphan_files")
            options["orphan_older_than_hours"] = min_age
        return [action for action in ACTIONS if action in wanted], options

    def _count_finished_jobs(self, report: OrchestratorReport) -> None:
        """Jobs this run submitted that already reached a terminal state (when run inline, say)."""
        for decision in report.decisions:
            if decision.decision != SUBMITTED or not decision.job_id:
                continue
            job = self.store.queue.get_job(decision.job_id)
            if job is not None and job.status == "completed":
                report.jobs_completed += 1
            elif job is not None and job.status == "failed":
                report.jobs_failed += 1
