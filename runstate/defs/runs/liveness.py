"""Is a run alive? One answer for the sensors, the CLI ticks and run monitoring, from a heartbeat.

Dagster's run status alone cannot tell: a run worker killed outright (SIGKILL, a reboot, `runstate dev`
stopped) never reports, so its run stays STARTED, holds its shard and its `runstate/spark` slot, and
only `dagster/max_runtime` would end it, minutes later. So every run that executes writes a heartbeat
every BEAT_INTERVAL_S from a daemon thread of its own process: a key per run in Dagster's own
key-value store (`run_storage.set_cursor_values`, the table sensor cursors live in), so there is no
schema of ours to migrate, and it lives in the same database as the run it speaks for.

A run is dead when it is FAILURE or CANCELED, or when it is in progress (STARTING, STARTED, CANCELING,
NOT_STARTED) and its last beat is older than `dead_after_s`; a STARTED run that never beat gets
`start_grace_s` from its start first, and a run still launching (NOT_STARTED, STARTING) is left to
Dagster's own start timeout. Whoever looks next (a sensor tick, a CLI tick, the daemon's run
monitoring through `HeartbeatRunLauncher`) reports such a run failed, which frees its concurrency
slots. A run that is alive is never declared dead while it beats: the run-key and tag fences stay.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dagster as dg

HEARTBEAT_KEY = "runstate.heartbeat.{}"
BEAT_INTERVAL_S = 2.0
DEAD_AFTER_ENV = "RUNSTATE_RUN_DEAD_AFTER_S"
DEFAULT_DEAD_AFTER_S = 20.0
# A run worker loads the code location before it starts and beats; under load that takes a while.
DEFAULT_START_GRACE_S = 60.0
DEAD_STATUSES = frozenset({dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED})
QUEUED_STATUSES = frozenset({dg.DagsterRunStatus.QUEUED})
LAUNCHING_STATUSES = frozenset({dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING})
IN_PROGRESS_STATUSES = frozenset(
    {
        dg.DagsterRunStatus.NOT_STARTED,
        dg.DagsterRunStatus.STARTING,
        dg.DagsterRunStatus.STARTED,
        dg.DagsterRunStatus.CANCELING,
    }
)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LivenessPolicy:
    """How stale a heartbeat may be, and how long a run that never beat is given."""

    dead_after_s: float = DEFAULT_DEAD_AFTER_S
    start_grace_s: float = DEFAULT_START_GRACE_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LivenessPolicy:
        raw = (os.environ if environ is None else environ).get(DEAD_AFTER_ENV, "")
        if not raw:
            return cls()
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 3 * BEAT_INTERVAL_S <= value <= 3600:  # also refuses nan
            raise ValueError(
                f"{DEAD_AFTER_ENV} must be a number of seconds in [{3 * BEAT_INTERVAL_S:g}, 3600], got {raw!r}"
            )
        return cls(dead_after_s=value, start_grace_s=max(DEFAULT_START_GRACE_S, value))


@dataclass(frozen=True)
class RunLiveness:
    """One run as the liveness check saw it."""

    run_id: str
    status: dg.DagsterRunStatus
    started_at: float | None  # epoch seconds: the run's start, else its creation
    beat_age_s: float | None  # None: never beat
    alive: bool

    @property
    def dead(self) -> bool:
        return self.status in DEAD_STATUSES or (self.status in IN_PROGRESS_STATUSES and not self.alive)

    def describe(self) -> str:
        """E.g. "run 1a2b3c4d, STARTED at 14:39:57 UTC, heartbeat 2 s ago"."""
        started = (
            datetime.fromtimestamp(self.started_at, UTC).strftime("%H:%M:%S UTC") if self.started_at else "?"
        )
        beat = "no heartbeat yet" if self.beat_age_s is None else f"heartbeat {self.beat_age_s:.0f} s ago"
        return f"run {self.run_id}, {self.status.value} since {started}, {beat}"


def _key(run_id: str) -> str:
    return HEARTBEAT_KEY.format(run_id)


def beat(instance: dg.DagsterInstance, run_id: str, now: float | None = None) -> None:
    """Record that `run_id` is alive now."""
    instance.run_storage.set_cursor_values({_key(run_id): repr(time.time() if now is None else now)})


def last_beats(instance: dg.DagsterInstance, run_ids: Iterable[str]) -> dict[str, float]:
    """The last heartbeat of each run that has one (one query for all of them)."""
    ids = list(run_ids)
    if not ids:
        return {}
    values = instance.run_storage.get_cursor_values({_key(run_id) for run_id in ids})
    beats = {}
    for run_id in ids:
        try:
            beats[run_id] = float(values[_key(run_id)])
        except (KeyError, ValueError):
            continue
    return beats


def forget(instance: dg.DagsterInstance, run_ids: Iterable[str]) -> None:
    """Drop the heartbeats of runs that ended, so the key-value table does not grow with every run."""
    from dagster._core.storage.runs.schema import KeyValueStoreTable

    keys = [_key(run_id) for run_id in run_ids]
    if not keys:
        return
    storage = instance.run_storage
    connect = getattr(storage, "connect", None)
    if connect is None:  # not a SQL run storage: the keys stay, which is harmless
        return
    with connect() as conn:
        conn.execute(KeyValueStoreTable.delete().where(KeyValueStoreTable.c.key.in_(keys)))


def _started_at(record: Any) -> float | None:
    if record.start_time is not None:
        return float(record.start_time)
    created = getattr(record, "create_timestamp", None)
    return created.timestamp() if created is not None else None


def judge(record: Any, last_beat: float | None, now: float, policy: LivenessPolicy) -> RunLiveness:
    """The liveness of one run record, given its last heartbeat (None: never beat)."""
    run = record.dagster_run
    started = _started_at(record)
    age = None if last_beat is None else max(0.0, now - last_beat)
    if run.status in IN_PROGRESS_STATUSES:
        if age is not None:
            alive = age < policy.dead_after_s
        elif run.status in LAUNCHING_STATUSES:
            # Its worker is still loading the code location (a minute and more on a loaded machine)
            # and beats only once it executes: Dagster's run monitoring judges a launch that never
            # starts (`start_timeout_seconds`). Reaping it here failed runs that went on to flush.
            alive = True
        else:
            alive = started is None or now - started < policy.start_grace_s
    else:  # queued runs wait for the coordinator; finished runs are neither alive nor to be reaped
        alive = run.status in QUEUED_STATUSES
    return RunLiveness(run.run_id, run.status, started, age, alive)


def check_runs(
    instance: dg.DagsterInstance,
    records: Iterable[Any],
    *,
    policy: LivenessPolicy | None = None,
    now: float | None = None,
) -> list[RunLiveness]:
    """Judge every record and report each in-progress run found dead as failed; returns the verdicts.

    The verdicts describe the runs as they are after that: a reaped run reads FAILURE.
    """
    policy = policy or LivenessPolicy.from_env()
    records = list(records)
    beats = last_beats(instance, [r.dagster_run.run_id for r in records])
    now = time.time() if now is None else now
    # Finished runs keep their last beat until someone looks: drop those keys now.
    forget(
        instance,
        [
            r.dagster_run.run_id
            for r in records
            if r.dagster_run.is_finished and r.dagster_run.run_id in beats
        ],
    )
    verdicts = []
    for record in records:
        verdict = judge(record, beats.get(record.dagster_run.run_id), now, policy)
        if verdict.status in IN_PROGRESS_STATUSES and not verdict.alive:
            verdict = _reap(instance, record.dagster_run, verdict, policy)
        verdicts.append(verdict)
    return verdicts


def _reap(
    instance: dg.DagsterInstance, run: dg.DagsterRun, verdict: RunLiveness, policy: LivenessPolicy
) -> RunLiveness:
    current = instance.get_run_by_id(run.run_id)
    if current is None or current.is_finished:  # it ended while we looked
        status = current.status if current is not None else dg.DagsterRunStatus.FAILURE
        return RunLiveness(verdict.run_id, status, verdict.started_at, verdict.beat_age_s, False)
    why = (
        f"no heartbeat for {verdict.beat_age_s:.0f} s (the bound is {policy.dead_after_s:g} s)"
        if verdict.beat_age_s is not None
        else f"no heartbeat {policy.start_grace_s:g} s after it started"
    )
    message = f"runstate: the run's process is gone ({why}); marked failed so its shard and slots are freed"
    log.warning("run %s: %s", run.run_id, message)
    instance.report_run_failed(current, message)
    forget(instance, [run.run_id])
    return RunLiveness(
        verdict.run_id, dg.DagsterRunStatus.FAILURE, verdict.started_at, verdict.beat_age_s, False
    )


class Heartbeat:
    """A daemon thread that beats for one run every `interval_s` until stopped.

    A failed beat (a database blip) is logged and retried at the next interval: a run is only taken for
    dead after `dead_after_s` without one.
    """

    def __init__(self, instance: dg.DagsterInstance, run_id: str, interval_s: float = BEAT_INTERVAL_S):
        self._instance, self.run_id, self._interval = instance, run_id, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{run_id[:8]}", daemon=True)

    def _loop(self) -> None:
        while True:
            try:
                beat(self._instance, self.run_id)
            except Exception as error:  # noqa: BLE001 - a missed beat must never end the run
                log.warning("run %s: heartbeat not written: %s", self.run_id, error)
            if self._stop.wait(self._interval):
                return

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self, *, ended: bool) -> None:
        """Stop beating. `ended`: the run's final status is stored, so its key can go; otherwise (a run
        worker's executor returning before the worker reports the run's end) one last beat covers the
        moment until it does, and the next look at the finished run drops the key."""
        self._stop.set()
        self._thread.join(timeout=10)
        try:
            if ended:
                forget(self._instance, [self.run_id])
            else:
                beat(self._instance, self.run_id)
        except Exception as error:  # noqa: BLE001 - the run's outcome matters more than its key
            log.warning("run %s: last heartbeat not written: %s", self.run_id, error)


@contextmanager
def heartbeat(instance: dg.DagsterInstance, run_id: str, *, ends_run: bool) -> Iterator[Heartbeat | None]:
    """Beat for `run_id` while the block runs; `ends_run`: the run's end is stored when the block ends.

    An ephemeral instance (in-memory SQLite, one process) gets no beats: no other process can judge its
    runs, and a beat's write there locked the tables under the run's own writes ("database table is
    locked").
    """
    if instance.is_ephemeral:
        yield None
        return
    beating = Heartbeat(instance, run_id).start()
    try:
        yield beating
    finally:
        beating.stop(ended=ends_run)
