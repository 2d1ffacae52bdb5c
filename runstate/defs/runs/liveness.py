"""Is a run alive? One answer for the sensors, the CLI and run monitoring, by the database's clock.

Dagster's run status alone cannot tell: a run worker killed outright (SIGKILL, a reboot, the deployment
stopped) never reports, so its run stays STARTING or STARTED, holds its shard and its Spark slot, and
only run monitoring (off by default) would end it. So every run that executes beats
(`runstate.defs.runs.heartbeat`), and its age is judged by one clock, the run storage database's
(`runstate.defs.runs.beats`).

A run in progress (NOT_STARTED, STARTING, STARTED, CANCELING) is dead when:
- its worker recorded its process on this machine, and that process has ended (`workers.ended_here`):
  a deployment SIGKILLed and restarted knows its old workers dead at its first look, not a heartbeat
  bound later, so their shards go to new runs at once;
- its last heartbeat is `dead_after_s` old (RUNSTATE_RUN_DEAD_AFTER_S);
- it never beat, and the code server that launched it (Dagster's default launcher records it on the run)
  does not run it: nothing listens at its address (gone with its deployment), or, while the run is
  still launching, the server says it does not run it (a started run that a live server does not know
  waits for its grace: after a reload of the code location, the server asked is not the one that runs
  it). It is asked only once the run has been seen without a heartbeat for `ask_server_after_s`, as a
  launch registers the run with its server a moment after it tags the run. Under the default launcher,
  a run STARTING without that tag by then was never handed to a code server (its daemon died
  mid-launch). A run put back in the queue (its launch could not reach the code server) is seen afresh
  when it is launched again;
- it never beat and nobody can be asked (another launcher: a pod, a task), and the first liveness check
  that saw it did so `start_grace_s` ago (STARTED) or `launch_grace_s` ago (still launching: its worker
  loads the code location before it beats, a minute and more on a loaded machine).

Whoever looks next (a sensor tick, the CLI, the daemon's run monitoring through `HeartbeatRunLauncher`)
reports such a run failed, which frees its shard and slots, having first ended its run worker and the
processes below it when they run on this machine (`runstate.defs.runs.workers`: a frozen worker's Spark
JVM goes on with its job, and a slot freed under it let a new JVM start beside it). Reaping a run by
mistake is safe: its process, should it still live elsewhere, finds its run failed and stops before it
changes anything (`runstate.defs.runs.heartbeat`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dagster as dg
from dagster._core.storage.tags import GRPC_INFO_TAG

from runstate.config import Settings, settings
from runstate.defs.runs import beats
from runstate.defs.runs.workers import WorkerProcess, end_process, ended_here

log = logging.getLogger(__name__)

DEAD_STATUSES = frozenset({dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED})
QUEUED_STATUSES = frozenset({dg.DagsterRunStatus.QUEUED})
LAUNCHING_STATUSES = frozenset({dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING})
IN_PROGRESS_STATUSES = frozenset(
    {*LAUNCHING_STATUSES, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING}
)
# Every status in which a run holds what it was started for: a shard, a Spark slot.
HOLDING_STATUSES = frozenset({*QUEUED_STATUSES, *IN_PROGRESS_STATUSES})
# A code server that does not answer within this is not taken for gone: the run keeps its grace.
ASK_SERVER_TIMEOUT_S = 5


@dataclass(frozen=True)
class LivenessPolicy:
    """How stale a heartbeat may be, and how long a run that never beat is given."""

    dead_after_s: float = Settings.run_dead_after_s
    start_grace_s: float = 60.0
    launch_grace_s: float = 300.0
    ask_server_after_s: float = 5.0

    @classmethod
    def from_settings(cls, config: Settings | None = None) -> LivenessPolicy:
        """The policy of RUNSTATE_RUN_DEAD_AFTER_S (read, with its bounds, by `runstate.config`)."""
        dead_after_s = (config or settings()).run_dead_after_s
        return cls(
            dead_after_s=dead_after_s,
            start_grace_s=max(cls.start_grace_s, dead_after_s),
            launch_grace_s=max(cls.launch_grace_s, dead_after_s),
        )


@dataclass(frozen=True)
class Signs:
    """What a liveness check knows of a run besides its status."""

    beat_age_s: float | None = None  # None: never beat
    seen_age_s: float | None = None  # since a check first saw it in progress without a heartbeat
    worker: bool | None = None  # its launching code server runs it (True), does not (False), unknown (None)
    worker_note: str = ""  # why it is known not to run it
    process_ended: str = ""  # its recorded process on this machine has ended: which


@dataclass(frozen=True)
class RunLiveness:
    """One run as the liveness check saw it."""

    run_id: str
    status: dg.DagsterRunStatus
    started_at: float | None  # for the description only: Dagster's record of the run's start or creation
    beat_age_s: float | None
    alive: bool
    reason: str = ""  # why a run in progress is dead

    @property
    def dead(self) -> bool:
        return self.status in DEAD_STATUSES or (self.status in IN_PROGRESS_STATUSES and not self.alive)

    def describe(self) -> str:
        """E.g. "run 1a2b3c4d, STARTED since 14:39:57 UTC, heartbeat 2 s ago"; a run that ended says when it
        started instead ("FAILURE, started 14:39:57 UTC, ...")."""
        started = (
            datetime.fromtimestamp(self.started_at, UTC).strftime("%H:%M:%S UTC") if self.started_at else "?"
        )
        waiting_or_running = self.status in IN_PROGRESS_STATUSES or self.status in QUEUED_STATUSES
        state = (
            f"{self.status.value} since {started}"
            if waiting_or_running
            else f"{self.status.value}, started {started}"
        )
        beat = "no heartbeat yet" if self.beat_age_s is None else f"heartbeat {self.beat_age_s:.0f} s ago"
        return f"run {self.run_id}, {state}, {beat}"

    def ended(self, status: dg.DagsterRunStatus) -> RunLiveness:
        return RunLiveness(self.run_id, status, self.started_at, self.beat_age_s, False, self.reason)


def _started_at(record: Any) -> float | None:
    if record.start_time is not None:
        return float(record.start_time)
    created = getattr(record, "create_timestamp", None)
    return created.timestamp() if created is not None else None


def judge(record: Any, signs: Signs, policy: LivenessPolicy) -> RunLiveness:
    """The liveness of one run record, from what is known of it (a pure function: no clock, no I/O)."""
    run = record.dagster_run
    reason = ""
    if run.status in QUEUED_STATUSES:  # waits for the run queue, which nothing here judges
        alive = True
    elif run.status not in IN_PROGRESS_STATUSES:  # ended: neither alive nor to be reaped
        alive = False
    elif signs.process_ended:
        alive = False
        reason = signs.process_ended
    elif signs.beat_age_s is not None:
        alive = signs.beat_age_s < policy.dead_after_s
        reason = f"no heartbeat for {signs.beat_age_s:.0f} s (the bound is {policy.dead_after_s:g} s)"
    elif signs.worker is False:
        alive = False
        reason = signs.worker_note
    else:
        grace = policy.launch_grace_s if run.status in LAUNCHING_STATUSES else policy.start_grace_s
        alive = signs.seen_age_s is None or signs.seen_age_s < grace
        seen = signs.seen_age_s or 0.0
        reason = (
            f"no heartbeat {seen:.0f} s after it was first seen {run.status.value} (the bound is {grace:g} s)"
        )
    return RunLiveness(
        run.run_id, run.status, _started_at(record), signs.beat_age_s, alive, "" if alive else reason
    )


NOT_RUN = "the code server that launched it does not run it (gone with its deployment, or the run exited)"
NEVER_HANDED = "its launch never reached a code server (the daemon that launched it was gone mid-launch)"


def code_server_runs(run: dg.DagsterRun, launcher: Any) -> tuple[bool | None, str]:
    """Whether the code server that launched `run` is executing it: True, False (nothing listens at its
    address any more, it says not while the run is launching, or Dagster's default launcher never tagged
    the run with one), or None (another launcher, no clear answer, or a started run it does not know);
    and why not."""
    from dagster._core.launcher import DefaultRunLauncher
    from dagster._grpc.client import DagsterGrpcClient
    from dagster._grpc.types import CanCancelExecutionRequest, CanCancelExecutionResult
    from dagster._serdes import deserialize_value
    from grpc import RpcError, StatusCode

    raw = run.tags.get(GRPC_INFO_TAG)
    if not raw:  # Dagster marks a run STARTING, then the default launcher tags it with its code server
        never = isinstance(launcher, DefaultRunLauncher) and run.status == dg.DagsterRunStatus.STARTING
        return (False, NEVER_HANDED) if never else (None, "")
    try:
        info = json.loads(raw)
        client = DagsterGrpcClient(
            host=info.get("host"),
            port=info.get("port"),
            socket=info.get("socket"),
            use_ssl=bool(info.get("use_ssl", False)),
        )
        answer = client.can_cancel_execution(
            CanCancelExecutionRequest(run_id=run.run_id), timeout=ASK_SERVER_TIMEOUT_S
        )
        if deserialize_value(answer, CanCancelExecutionResult).can_cancel:
            return True, ""
        # A server that answers but does not know a run that started may not be the one that launched it:
        # `dagster code-server start` (dagster dev's) asks the server of its last reload, and the run's
        # worker, still alive under the old one, beats within seconds of its start. Its grace judges it.
        return (False, NOT_RUN) if run.status in LAUNCHING_STATUSES else (None, "")
    except Exception as error:  # noqa: BLE001 - only a closed address is an answer
        cause = error.__cause__
        if isinstance(cause, RpcError) and cause.code() == StatusCode.UNAVAILABLE:  # ty: ignore
            return False, NOT_RUN
        log.info("run %s: its code server gave no clear answer: %s", run.run_id, error)
        return None, ""


def observe(instance: dg.DagsterInstance, records: list[Any], policy: LivenessPolicy) -> dict[str, Signs]:
    """The signs of each in-progress run: heartbeat and sighting ages, and its code server's answer.

    A run in progress without either row is seen now (its grace starts), and its code server is asked
    only once the run has been seen for `ask_server_after_s`."""
    in_progress = [r.dagster_run for r in records if r.dagster_run.status in IN_PROGRESS_STATUSES]
    known = beats.ages(instance, [run.run_id for run in in_progress])
    unseen = [run.run_id for run in in_progress if run.run_id not in known]
    if unseen:
        beats.mark_seen(instance, unseen)
    ended = _processes_ended(instance, [run.run_id for run in in_progress if run.run_id in known])
    signs = {}
    for run in in_progress:
        age = known.get(run.run_id, beats.Ages(seen_s=0.0))
        ask = age.beat_s is None and (age.seen_s or 0.0) >= policy.ask_server_after_s
        worker, note = code_server_runs(run, instance.run_launcher) if ask else (None, "")
        signs[run.run_id] = Signs(age.beat_s, age.seen_s, worker, note, ended.get(run.run_id, ""))
    return signs


def _processes_ended(instance: dg.DagsterInstance, run_ids: list[str]) -> dict[str, str]:
    """For each run whose recorded process on this machine has ended: why it is dead."""
    try:
        recorded = beats.workers_of(instance, run_ids)
    except Exception as error:  # noqa: BLE001 - the heartbeat bound still judges them
        log.warning("could not read where the runs' processes run: %s", error)
        return {}
    ended = {}
    for run_id, text in recorded.items():
        worker = WorkerProcess.from_text(text)
        if worker is not None and ended_here(worker):
            ended[run_id] = f"its process {worker.pid} on this machine has ended"
    return ended


def check_runs(
    instance: dg.DagsterInstance, records: Iterable[Any], *, policy: LivenessPolicy | None = None
) -> list[RunLiveness]:
    """Judge every record and report each in-progress run found dead as failed; returns the verdicts.

    The verdicts describe the runs as they are after that: a reaped run reads FAILURE.
    """
    policy = policy or LivenessPolicy.from_settings()
    records = list(records)
    # Finished runs keep their rows until someone looks: drop them now.
    beats.forget(instance, [r.dagster_run.run_id for r in records if r.dagster_run.is_finished])
    # A launch that could not reach its code server puts the run back in the queue, its STARTING sighting
    # (and code server tag) left behind: the next launch must not inherit that sighting's age, or it is
    # failed the moment it is STARTING again, before it could be tagged or registered.
    queued = [r.dagster_run.run_id for r in records if r.dagster_run.status in QUEUED_STATUSES]
    beats.forget(instance, queued, prefixes=(beats.SEEN_PREFIX,))
    signs = observe(instance, records, policy)
    verdicts = []
    for record in records:
        verdict = judge(record, signs.get(record.dagster_run.run_id, Signs()), policy)
        if verdict.status in IN_PROGRESS_STATUSES and not verdict.alive:
            verdict = _reap(instance, record.dagster_run, verdict)
        verdicts.append(verdict)
    return verdicts


def _reap(instance: dg.DagsterInstance, run: dg.DagsterRun, verdict: RunLiveness) -> RunLiveness:
    current = instance.get_run_by_id(run.run_id)
    if current is None or current.is_finished:  # it ended while we looked
        return verdict.ended(current.status if current is not None else dg.DagsterRunStatus.FAILURE)
    ended = end_worker(instance, run.run_id)
    message = (
        f"runstate: the run's process is gone ({verdict.reason}){ended}; marked failed so its shard and "
        "slots are freed"
    )
    log.warning("run %s: %s", run.run_id, message)
    instance.report_run_failed(current, message)
    beats.forget(instance, [run.run_id])
    return verdict.ended(dg.DagsterRunStatus.FAILURE)


def end_worker(instance: dg.DagsterInstance, run_id: str) -> str:
    """End the recorded process of a run found dead, with every process below it (its Spark JVM keeps
    running its job while a frozen worker holds its pipe open): before its slot is freed. Returns "; "
    and what was done, or "" when no process of it was recorded."""
    try:
        recorded = beats.worker_of(instance, run_id)
    except Exception as error:  # noqa: BLE001 - the verdict stands; the process is left to its fence
        log.warning("run %s: could not read where its process runs: %s", run_id, error)
        return ""
    worker = WorkerProcess.from_text(recorded) if recorded else None
    return f"; {end_process(worker)}" if worker is not None else ""


def sweep_rows(instance: dg.DagsterInstance) -> int:
    """Drop the heartbeat and sighting rows of runs that ended (or are gone); returns how many runs."""
    tracked = beats.tracked_run_ids(instance)
    if not tracked:
        return 0
    live = {
        run.run_id
        for run in instance.get_runs(dg.RunsFilter(run_ids=tracked))
        if run.status in HOLDING_STATUSES
    }
    ended = [run_id for run_id in tracked if run_id not in live]
    beats.forget(instance, ended)
    return len(ended)
