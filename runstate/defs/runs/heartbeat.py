"""A run's heartbeat, and the fence that stops a run declared dead from changing anything more.

Every run that executes beats every BEAT_INTERVAL_S from a daemon thread of its own process
(`runstate.defs.runs.beats` stamps it with the database's clock). Should its process stop for a while
(SIGSTOP, a frozen VM, a long GC pause, a lost network) another process may find the beat stale, fail the
run and hand its shard to a new run. When the process resumes it must not go on: no materialization, no
Applied mark, no success after the failure. So it stops itself, with one line on stderr and exit code 1:
- the heartbeat thread reads the run's status with each beat, and stops the process once the run is
  FAILURE or CANCELED;
- a process that could not store a beat for `dead_after_s` by its own monotonic clock stops without
  asking: a beat is stamped after it is sent, so by then the database may judge it dead too;
- the main thread may run before the heartbeat thread after a pause, so the ops call `ensure_alive`
  before each unit of work and before they report it, and the executor wrapper checks once more before
  the run worker writes the run's success;
- a worker that starts after its run was reaped while launching finds the reap in the run's event log
  (its own RUN_START may have overwritten the status) and does nothing.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import dagster as dg

from runstate.defs.runs import beats
from runstate.defs.runs.liveness import DEAD_STATUSES, LivenessPolicy
from runstate.defs.runs.workers import this_process

BEAT_INTERVAL_S = 2.0
REAPED_EVENTS = {dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_CANCELED}
log = logging.getLogger(__name__)
# The heartbeats of the runs executing in this process, by run id: the ops' fence finds its run's here.
_BEATING: dict[str, Heartbeat] = {}


def stop_zombie(run_id: str, why: str) -> NoReturn:
    """End this process at once: its run was (or may have been) declared dead, and whatever it did next
    would be a second writer beside the run that took its work over. Exit code 1, never a signal."""
    sys.stderr.write(
        f"Error: run {run_id} {why}; this process stops here, and the run that takes its work over does it\n"
    )
    sys.stderr.flush()
    os._exit(1)


class Heartbeat:
    """A daemon thread that beats for one run every `interval_s` until stopped, and the run's fence.

    A failed beat (a database blip) is logged and retried at the next interval; only `dead_after_s`
    without a stored beat stops the process.
    """

    def __init__(
        self,
        instance: dg.DagsterInstance,
        run_id: str,
        *,
        dead_after_s: float,
        interval_s: float = BEAT_INTERVAL_S,
    ):
        self._instance, self.run_id = instance, run_id
        self._interval, self._dead_after_s = interval_s, dead_after_s
        self._last_stored = time.monotonic()  # when the last stored beat was sent (monotonic)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{run_id[:8]}", daemon=True)

    def _loop(self) -> None:
        while True:
            self._beat()
            if self._stop.wait(self._interval):
                return

    def _beat(self) -> None:
        self._check_own_clock()
        sent = time.monotonic()
        try:
            self._check_status(full=False)
            beats.beat(self._instance, self.run_id)
        except Exception as error:  # noqa: BLE001 - a missed beat must not end the run by itself
            log.warning("run %s: heartbeat not written: %s", self.run_id, error)
            return
        self._last_stored = sent

    def _check_own_clock(self) -> None:
        silent = time.monotonic() - self._last_stored
        if silent >= self._dead_after_s:
            stop_zombie(
                self.run_id,
                f"may have been declared dead: this process could not beat for {silent:.0f} s "
                f"(the bound is {self._dead_after_s:g} s)",
            )

    def _check_status(self, *, full: bool) -> None:
        run = self._instance.get_run_by_id(self.run_id)
        if run is None:  # an in-process run beats from before its run is created
            return
        if run.status in DEAD_STATUSES and not self._ended_here():
            stop_zombie(self.run_id, f"was declared dead (it is {run.status.value})")
        if full and self._instance.get_records_for_run(self.run_id, of_type=REAPED_EVENTS, limit=1).records:
            # Our own RUN_START overwrote the failed status: put it back, or the run would hold its shard
            # until it is found dead a second time.
            self._instance.report_run_failed(run, "runstate: its worker started after the run was failed")
            stop_zombie(self.run_id, "was declared dead before its worker started")

    def _ended_here(self) -> bool:
        """Whether this process wrote the run's first failure (or cancellation) itself: an in-process run
        beats until `execute_in_process` returns, after the run's own end is stored."""
        first = self._instance.get_records_for_run(self.run_id, of_type=REAPED_EVENTS, limit=1).records
        event = first[0].event_log_entry.dagster_event if first else None
        return event is not None and event.pid == os.getpid()

    def check(self, *, full: bool = False) -> None:
        """Stop this process if its run was (or may have been) declared dead; `full` also reads the run's
        event log for a reap that its own RUN_START overwrote."""
        self._check_own_clock()
        self._check_status(full=full)

    def start(self, *, record_process: bool = False) -> Heartbeat:
        """Start beating; `record_process`: this process is the run's worker, which whoever declares the
        run dead ends, with its Spark JVM (never a CLI's, whose exit code is 1 from its fence)."""
        worker = this_process() if record_process else None
        if worker is not None:
            try:
                beats.record_worker(self._instance, self.run_id, worker.as_text())
            except Exception as error:  # noqa: BLE001 - the run goes on; only the record of it is lost
                log.warning("run %s: its process was not recorded: %s", self.run_id, error)
        self._thread.start()
        return self

    def stop(self, *, ended: bool) -> None:
        """Stop beating. `ended`: the run's final status is stored, so its row can go; otherwise (a run
        worker's executor returning before the worker reports the run's end) one last beat covers the
        moment until it does, and a later look at the finished run drops the row."""
        self._stop.set()
        self._thread.join(timeout=10)
        try:
            if ended:
                beats.forget(self._instance, [self.run_id])
            else:
                beats.beat(self._instance, self.run_id)
        except Exception as error:  # noqa: BLE001 - the run's outcome matters more than its row
            log.warning("run %s: last heartbeat not written: %s", self.run_id, error)


@contextmanager
def heartbeat(
    instance: dg.DagsterInstance, run_id: str, *, ends_run: bool, worker: bool = False
) -> Iterator[Heartbeat | None]:
    """Beat for `run_id` while the block runs; `ends_run`: the run's end is stored when the block ends;
    `worker`: this process is a run worker, recorded so that its run's reaper ends it (Heartbeat.start).

    An ephemeral instance (in-memory SQLite, one process) gets no beats: no other process can judge its
    runs, and a beat's write there locked the tables under the run's own writes ("database table is
    locked").
    """
    if instance.is_ephemeral:
        yield None
        return
    policy = LivenessPolicy.from_settings()
    beating = Heartbeat(instance, run_id, dead_after_s=policy.dead_after_s).start(record_process=worker)
    _BEATING[run_id] = beating
    try:
        yield beating
    finally:
        _BEATING.pop(run_id, None)
        beating.stop(ended=ends_run)


def ensure_alive(context: dg.OpExecutionContext) -> None:
    """The ops' fence: stop this process if its run was declared dead. Call it before each unit of work
    (a flush round, a merge, a claim) and before reporting one (a materialization)."""
    beating = _BEATING.get(context.run_id)
    if beating is not None:
        beating.check()
        return
    if context.instance.is_ephemeral:
        return
    run = context.instance.get_run_by_id(context.run_id)
    if run is not None and run.status in DEAD_STATUSES:
        stop_zombie(context.run_id, f"was declared dead (it is {run.status.value})")
