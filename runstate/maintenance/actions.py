"""Maintenance actions as Iceberg Spark procedures on the `lake` catalog, and the fenced job runner.

Iceberg's `CALL` parser takes no bound parameters, so every value that reaches the SQL text is
either a validated identifier, an integer, or a timestamp we format ourselves.
A dry run writes nothing: orphans use the procedure's own `dry_run`, the other actions report a
plan computed from the metadata tables.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from runstate.maintenance.errors import MaintenanceError
from runstate.maintenance.identifiers import (
    ACTIONS,
    TableRef,
    UnknownAction,
    validate_identifier,
)
from runstate.maintenance.store import Claim

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

CATALOG = "lake"
STRATEGIES = ("binpack", "sort")
# Iceberg refuses remove_orphan_files with an interval under 24 hours (concurrent writers' files).
MIN_ORPHAN_AGE_HOURS = 24
# Iceberg's binpack defaults: files under 75% of the target are candidates, 5 of them make a group.
BINPACK_MIN_FILE_RATIO = 0.75
BINPACK_MIN_INPUT_FILES = 5
_SORT_TERM = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}( (ASC|DESC))?( NULLS (FIRST|LAST))?", re.IGNORECASE)


class InvalidActionOption(MaintenanceError, ValueError):
    """A maintenance option that is missing its rules (bad type, range or sort order)."""


class TableLocked(MaintenanceError, RuntimeError):
    """Another holder owns the table lock; the job was not run and its lease will expire for a retry."""


@dataclass(frozen=True)
class ActionSettings:
    """How each action runs; the defaults come from config, a job's `options` override them."""

    rewrite_strategy: str = "binpack"
    sort_order: str | None = None
    target_file_size_bytes: int = 128 * 1024 * 1024
    expire_older_than_hours: float = 72.0
    retain_last: int = 10
    orphan_older_than_hours: float = 72.0

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None, base: "ActionSettings | None" = None) -> "ActionSettings":
        """Validate a job's options over `base`; any unknown key or bad value raises InvalidActionOption."""
        base = base or cls()
        options = dict(options or {})
        unknown = sorted(set(options) - set(cls.__dataclass_fields__))
        if unknown:
            raise InvalidActionOption(
                f"unknown maintenance option(s) {unknown}; known: {', '.join(cls.__dataclass_fields__)}"
            )
        return replace(base, **options).validated()

    def validated(self) -> "ActionSettings":
        if self.rewrite_strategy not in STRATEGIES:
            raise InvalidActionOption(f"rewrite_strategy {self.rewrite_strategy!r} must be one of {STRATEGIES}")
        if self.rewrite_strategy == "sort" and self.sort_order is not None:
            sort_order_sql(self.sort_order)
        if self.sort_order is not None and self.rewrite_strategy != "sort":
            raise InvalidActionOption("sort_order needs rewrite_strategy 'sort'")
        _positive_int("target_file_size_bytes", self.target_file_size_bytes)
        _positive_int("retain_last", self.retain_last)
        _non_negative_number("expire_older_than_hours", self.expire_older_than_hours)
        _non_negative_number("orphan_older_than_hours", self.orphan_older_than_hours)
        if self.orphan_older_than_hours < MIN_ORPHAN_AGE_HOURS:
            raise InvalidActionOption(
                f"orphan_older_than_hours {self.orphan_older_than_hours} is under {MIN_ORPHAN_AGE_HOURS}: "
                "Iceberg refuses it, files of running writers could be deleted"
            )
        return self


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidActionOption(f"{name} must be a positive integer, got {value!r}")


def _non_negative_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidActionOption(f"{name} must be a non-negative number of hours, got {value!r}")


def sort_order_sql(sort_order: str) -> str:
    """`id DESC NULLS LAST, v` -> the same text, after every term passed the validator."""
    terms = [term.strip() for term in sort_order.split(",")]
    for term in terms:
        if not _SORT_TERM.fullmatch(" ".join(term.split())) or "\n" in term:
            raise InvalidActionOption(f"sort_order term {term!r} must be `column [ASC|DESC] [NULLS FIRST|LAST]`")
    return ", ".join(" ".join(term.split()) for term in terms)


def timestamp_literal(moment: datetime) -> str:
    """A Spark TIMESTAMP literal in UTC, with the zone spelled out so session settings cannot shift it."""
    utc = moment.astimezone(timezone.utc)
    return f"TIMESTAMP '{utc.strftime('%Y-%m-%d %H:%M:%S.%f')}+00:00'"


@dataclass(frozen=True)
class ActionResult:
    action: str
    success: bool
    message: str = ""
    error: str | None = None
    elapsed_seconds: float = 0.0
    figures: Mapping[str, Any] = field(default_factory=dict)


def _figures_message(figures: Mapping[str, Any], prefix: str = "") -> str:
    text = ", ".join(f"{key}={value}" for key, value in figures.items())
    return f"{prefix}{text}" if text else prefix.rstrip(": ") or "no output"


def _sum_rows(rows: list) -> dict[str, int]:
    """Procedures return one row of counters (sometimes none when there was nothing to do)."""
    totals: dict[str, int] = {}
    for row in rows:
        for key, value in row.asDict().items():
            totals[key] = totals.get(key, 0) + (value or 0)
    return totals


class ActionRunner:
    """Runs one table's actions through `CALL lake.system.<procedure>` or plans them for a dry run."""

    def __init__(
        self,
        spark: "SparkSession",
        ref: TableRef,
        settings: ActionSettings | None = None,
        *,
        catalog: str = CATALOG,
        now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> None:
        self.spark = spark
        self.ref = ref
        self.settings = (settings or ActionSettings()).validated()
        self.catalog = validate_identifier(catalog, "catalog name")
        self.now = now

    # -- shared helpers -------------------------------------------------------------------------
    def _call(self, procedure: str, *arguments: str) -> list:
        args = ", ".join((f"table => '{self.ref.key}'", *arguments))
        return self.spark.sql(f"CALL {self.catalog}.system.{procedure}({args})").collect()

    def _metadata(self, name: str):
        return self.spark.table(f"{self.ref.in_catalog(self.catalog)}.{validate_identifier(name, 'metadata table')}")

    def _older_than(self, hours: float) -> str:
        return timestamp_literal(self.now() - timedelta(hours=hours))

    # -- the actions ----------------------------------------------------------------------------
    def rewrite_data_files(self, dry_run: bool) -> tuple[str, dict]:
        s = self.settings
        if dry_run:
            return self._plan_rewrite_data_files()
        arguments = [f"strategy => '{s.rewrite_strategy}'"]
        if s.rewrite_strategy == "sort" and s.sort_order:
            arguments.append(f"sort_order => '{sort_order_sql(s.sort_order)}'")
        arguments.append(f"options => map('target-file-size-bytes', '{int(s.target_file_size_bytes)}')")
        figures = _sum_rows(self._call("rewrite_data_files", *arguments))
        return _figures_message(figures), figures

    def _plan_rewrite_data_files(self) -> tuple[str, dict]:
        from pyspark.sql import functions as F

        s = self.settings
        threshold = int(s.target_file_size_bytes * BINPACK_MIN_FILE_RATIO)
        files = self._metadata("data_files")
        if s.rewrite_strategy == "binpack":
            files = files.where(F.col("file_size_in_bytes") < F.lit(threshold))
        row = files.agg(F.count(F.lit(1)).alias("n"), F.coalesce(F.sum("file_size_in_bytes"), F.lit(0)).alias("b")).first()
        count, size = int(row["n"]), int(row["b"])
        if s.rewrite_strategy == "binpack" and count < BINPACK_MIN_INPUT_FILES:
            count, size = 0, 0
        planned = max(1, math.ceil(size / s.target_file_size_bytes)) if count else 0
        figures = {"would_rewrite_data_files_count": count, "would_rewrite_bytes_count": size,
                   "would_add_data_files_count": planned}
        return _figures_message(figures, "dry run: "), figures

    def rewrite_position_delete_files(self, dry_run: bool) -> tuple[str, dict]:
        if dry_run:
            from pyspark.sql import functions as F

            row = (
                self._metadata("delete_files").where(F.col("content") == F.lit(1))
                .agg(F.count(F.lit(1)).alias("n"), F.coalesce(F.sum("file_size_in_bytes"), F.lit(0)).alias("b"))
                .first()
            )
            figures = {"would_rewrite_delete_files_count": int(row["n"]), "would_rewrite_bytes_count": int(row["b"])}
            return _figures_message(figures, "dry run: "), figures
        figures = _sum_rows(self._call("rewrite_position_delete_files"))
        return _figures_message(figures), figures

    def rewrite_manifests(self, dry_run: bool) -> tuple[str, dict]:
        if dry_run:
            figures = {"would_rewrite_manifests_count": self._metadata("manifests").count()}
            return _figures_message(figures, "dry run: "), figures
        figures = _sum_rows(self._call("rewrite_manifests"))
        return _figures_message(figures), figures

    def expire_snapshots(self, dry_run: bool) -> tuple[str, dict]:
        s = self.settings
        if dry_run:
            return self._plan_expire_snapshots()
        figures = _sum_rows(self._call(
            "expire_snapshots",
            f"older_than => {self._older_than(s.expire_older_than_hours)}",
            f"retain_last => {int(s.retain_last)}",
        ))
        return _figures_message(figures), figures

    def _plan_expire_snapshots(self) -> tuple[str, dict]:
        # Iceberg keeps the current snapshot, the newest `retain_last`, and all newer than the cutoff.
        s = self.settings
        cutoff = (self.now() - timedelta(hours=s.expire_older_than_hours)).astimezone(timezone.utc).replace(tzinfo=None)
        rows = self._metadata("snapshots").select("committed_at").orderBy("committed_at", ascending=False).collect()
        expirable = [r for i, r in enumerate(rows) if i >= s.retain_last and r["committed_at"] < cutoff]
        figures = {"would_expire_snapshots_count": len(expirable), "snapshot_count": len(rows)}
        return _figures_message(figures, "dry run: "), figures

    def remove_orphan_files(self, dry_run: bool) -> tuple[str, dict]:
        rows = self._call(
            "remove_orphan_files",
            f"older_than => {self._older_than(self.settings.orphan_older_than_hours)}",
            f"dry_run => {'true' if dry_run else 'false'}",
        )
        key = "would_remove_orphan_files_count" if dry_run else "removed_orphan_files_count"
        figures = {key: len(rows)}
        return _figures_message(figures, "dry run: " if dry_run else ""), figures

    def run(self, action: str, dry_run: bool = False) -> ActionResult:
        """One action; a Spark failure becomes an unsuccessful result that names the table."""
        if action not in ACTIONS:
            raise UnknownAction(f"unknown maintenance action {action!r}; choose from {', '.join(ACTIONS)}")
        started = time.perf_counter()
        try:
            message, figures = getattr(self, action)(dry_run)
        except Exception as exc:  # noqa: BLE001 - recorded in job_actions, the job then fails
            error = f"{action} on {self.ref.key} failed: {type(exc).__name__}: {_first_line(exc)}"
            log.warning("%s", error)
            return ActionResult(action, False, "", error, time.perf_counter() - started)
        return ActionResult(action, True, message, None, time.perf_counter() - started, figures)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


# -- the fenced job runner --------------------------------------------------------------------


class JobStore(Protocol):
    """The part of MaintenanceStore a job run needs (the core packages stay decoupled)."""

    def heartbeat(self, claim: Any, lease_seconds: float | None = None) -> bool: ...
    def record_action(self, claim: Any, action: str, success: bool, message: str = "", error: str | None = None,
                      elapsed_seconds: float = 0.0) -> bool: ...
    def complete(self, claim: Any, status: str, error: str | None = None) -> bool: ...
    def is_cancel_requested(self, claim: Any) -> bool: ...
    def acquire_table_lock(self, table_key: str, holder: str, ttl_seconds: float) -> bool: ...
    def release_table_lock(self, table_key: str, holder: str) -> bool: ...


@dataclass
class JobOutcome:
    job_id: str
    attempt_id: str
    status: str  # completed | failed | cancelled | fenced_out
    results: list[ActionResult] = field(default_factory=list)
    error: str | None = None

    @property
    def completed_actions(self) -> list[str]:
        return [r.action for r in self.results if r.success]


class LeaseKeeper:
    """A thread that heartbeats the claim and refreshes the table lock until stopped or fenced out."""

    def __init__(self, store: JobStore, claim: Any, table_key: str, holder: str, *, interval_seconds: float,
                 lease_seconds: float, lock_ttl_seconds: float) -> None:
        self.store, self.claim, self.table_key, self.holder = store, claim, table_key, holder
        self.interval, self.lease_seconds, self.lock_ttl = interval_seconds, lease_seconds, lock_ttl_seconds
        self.fenced_out = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"lease-{claim.job_id}", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                alive = self.store.heartbeat(self.claim, self.lease_seconds)
                alive = alive and self.store.acquire_table_lock(self.table_key, self.holder, self.lock_ttl)
            except Exception:  # noqa: BLE001 - a database blip; the next beat retries, the lease has slack
                log.exception("heartbeat for job %s failed", self.claim.job_id)
                continue
            if not alive:
                self.fenced_out.set()
                return

    def __enter__(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_job(
    spark: "SparkSession",
    store: JobStore,
    claim: Any,
    *,
    settings: ActionSettings | None = None,
    catalog: str = CATALOG,
    lock_ttl_seconds: float = 600,
    heartbeat_seconds: float | None = None,
    after_action: Callable[[ActionResult], None] | None = None,
) -> JobOutcome:
    """Run a claimed job: hold the table lock, heartbeat, run its actions in order, complete under the fence.

    Stops between actions when the job is cancelled or the claim is fenced out. Raises TableLocked
    (nothing run, nothing recorded) when another holder has the table; the lease then expires and
    the job is claimed again later, or fails at its maximum attempts.
    """
    ref = TableRef(claim.database, claim.table)
    # The lock holder is the attempt (the fence), so a fenced-out attempt still running keeps the
    # table from its own job's next attempt until its lock expires.
    holder = claim.attempt_id
    try:
        action_settings = ActionSettings.from_options(claim.options, settings)
    except InvalidActionOption as exc:
        error = f"job {claim.job_id} on {ref.key}: {exc}"
        done = store.complete(claim, "failed", error)
        return JobOutcome(claim.job_id, claim.attempt_id, "failed" if done else "fenced_out", [], error)
    if not store.acquire_table_lock(ref.key, holder, lock_ttl_seconds):
        raise TableLocked(f"table {ref.key} is locked by another maintenance job; job {claim.job_id} not run")
    runner = ActionRunner(spark, ref, action_settings, catalog=catalog)
    outcome = JobOutcome(claim.job_id, claim.attempt_id, "completed")
    lease_seconds = float(claim.lease_seconds)
    # Three beats per lease: one lost beat never costs the claim.
    heartbeat_seconds = heartbeat_seconds or max(lease_seconds / 3, 0.05)
    try:
        with LeaseKeeper(store, claim, ref.key, holder, interval_seconds=heartbeat_seconds,
                         lease_seconds=lease_seconds, lock_ttl_seconds=lock_ttl_seconds) as keeper:
            outcome.status = _run_actions(runner, store, claim, keeper, outcome, after_action)
        if outcome.status == "fenced_out":
            return outcome
        failures = [r.error for r in outcome.results if not r.success]
        if failures:
            outcome.status, outcome.error = "failed", "; ".join(e for e in failures if e)
        if not store.complete(claim, outcome.status, outcome.error):
            outcome.status = "fenced_out"
        return outcome
    finally:
        store.release_table_lock(ref.key, holder)


def _run_actions(runner: ActionRunner, store: JobStore, claim: Any, keeper: LeaseKeeper, outcome: JobOutcome,
                 after_action: Callable[[ActionResult], None] | None) -> str:
    for action in claim.actions:
        # A beat right before each action: a worker whose lease ran out never starts another procedure.
        if keeper.fenced_out.is_set() or not store.heartbeat(claim, keeper.lease_seconds):
            return "fenced_out"
        if store.is_cancel_requested(claim):
            return "cancelled"
        result = runner.run(action, dry_run=claim.dry_run)
        outcome.results.append(result)
        if not store.record_action(claim, result.action, result.success, result.message, result.error,
                                   result.elapsed_seconds):
            return "fenced_out"
        if after_action is not None:
            after_action(result)
    # A cancel that arrives after the last action is too late to stop anything: the job did complete.
    return "completed"


# -- the queue side of a worker ---------------------------------------------------------------


def claim_ready(store: Any, worker: str, lease_seconds: float, concurrency_limit: int) -> list[Claim]:
    """Claim ready jobs while fewer than `concurrency_limit` hold a live lease."""
    ready, in_flight = store.queue_depth()
    running = in_flight - ready
    claims: list[Claim] = []
    for _ in range(max(0, concurrency_limit - running)):
        claim = store.claim(worker, lease_seconds)
        if claim is None:
            break
        claims.append(claim)
    return claims


def resume_claim(store: Any, job_id: str, attempt_id: str, lease_seconds: float) -> Claim | None:
    """The Claim a worker process received by id (a Dagster run's config); None when its fence is gone."""
    job = store.get_job(job_id)
    if job is None or job.attempt_id != attempt_id:
        return None
    if not (job.status == "running" or job.cancel_requested):
        return None
    return Claim(
        job_id=job.job_id, attempt_id=attempt_id, database=job.database, table=job.table,
        actions=tuple(job.actions), dry_run=job.dry_run, options=dict(job.options or {}),
        attempt_count=job.attempt_count or 0, worker=job.claimed_by or "", lease_seconds=lease_seconds,
    )
