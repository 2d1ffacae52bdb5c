"""A stopping run worker ends its run: an interrupt is not a fault to retry.

Dagster applies an op's retry policy to interrupts too: the SIGTERM that a run worker gets when the
deployment stops (a deploy, a reboot, `runstate dev` stopped) raises DagsterExecutionInterruptedError in
the op, and with a policy the step is re-executed in the same dying process, so the worker went on
flushing, merging or claiming work for as long as it was let live, and often died before it recorded
its run's end. `ends_run_when_interrupted` turns the interrupt into a Failure that bypasses the policy:
the worker records the run failed and exits, and after a restart the daemon's run retries (or the next
sensor tick) start the work again, which every write path makes safe to repeat.

An op blocked in Spark (a py4j call) does not see the interrupt until the JVM answers:
`spark_jobs_cancelled_on_interrupt` cancels its Spark jobs when the signal comes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import dagster as dg
from dagster._core.errors import DagsterExecutionInterruptedError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ComputeFn = TypeVar("ComputeFn", bound=Callable[..., Any])
INTERRUPTED = (
    "interrupted by a signal (the deployment is stopping): the run ends here, not retried in this "
    "process; its work is idempotent and is taken up again after the restart"
)


def ends_run_when_interrupted(compute_fn: ComputeFn) -> ComputeFn:
    """Wrap an op's or asset's compute function (under its decorator) so an interrupt fails it at once."""

    @functools.wraps(compute_fn)
    def compute(*args: Any, **kwargs: Any) -> Any:
        try:
            return compute_fn(*args, **kwargs)
        except (DagsterExecutionInterruptedError, KeyboardInterrupt) as interrupt:
            raise dg.Failure(description=INTERRUPTED, allow_retries=False) from interrupt

    return compute  # type: ignore[return-value]


class SignalWatch:
    """Whether SIGINT or SIGTERM arrived while a `spark_jobs_cancelled_on_interrupt` block ran."""

    def __init__(self) -> None:
        self.seen = threading.Event()

    def check(self) -> None:
        """Fail the op as interrupted if a signal came (its Spark job then ended in a cancellation error,
        which the op would otherwise take for one dataset's failure and go on)."""
        if self.seen.is_set():
            raise dg.Failure(description=INTERRUPTED, allow_retries=False)


@contextmanager
def spark_jobs_cancelled_on_interrupt(session: SparkSession | None = None) -> Iterator[SignalWatch]:
    """While the block runs, SIGINT or SIGTERM cancels the session's Spark jobs (no session: those of the
    process's Spark context, if one started by then: a worker that builds its session lazily).

    A py4j call blocks the main thread until the JVM answers, and Python runs signal handlers in the main
    thread only: the SIGTERM of a stopping deployment waited for the merge's Spark job to end, minutes,
    and the worker was killed first with its run left STARTED. CPython's C-level handler still writes
    the signal's number to the wakeup fd, from whichever thread takes the signal; a watcher thread reads
    it and cancels the jobs, the call returns with an error, and the op fails as interrupted.
    """
    watch = SignalWatch()
    if threading.current_thread() is not threading.main_thread():  # no signal handler here to begin with
        yield watch
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    done = threading.Event()

    def cancel_on_signal() -> None:
        while True:
            received = os.read(read_fd, 64)
            if done.is_set() or not received:
                return
            if previous != -1:  # whoever watched before keeps seeing every signal
                with contextlib.suppress(OSError):
                    os.write(previous, received)
            if {signal.SIGINT, signal.SIGTERM} & set(received):
                watch.seen.set()
                with contextlib.suppress(Exception):  # a session already gone has nothing to cancel
                    _spark_context(session).cancelAllJobs()

    watcher = threading.Thread(target=cancel_on_signal, name="spark-cancel-on-signal", daemon=True)
    watcher.start()
    try:
        yield watch
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        os.write(write_fd, b"\0")  # wakes the watcher, which sees `done` and returns
        watcher.join(timeout=10)
        os.close(read_fd)
        os.close(write_fd)


def _spark_context(session: SparkSession | None) -> Any:
    if session is not None:
        return session.sparkContext
    from pyspark import SparkContext

    return SparkContext._active_spark_context  # None before the first session: AttributeError, suppressed
