"""Spark jobs cancelled when SIGINT or SIGTERM comes (no Dagster here): for run workers and the CLI alike.

A py4j call blocks the main thread until the JVM answers, and Python runs signal handlers in the main
thread only: the SIGTERM of a stopping deployment waited for the merge's Spark job to end, minutes,
and the worker was killed first with its run left STARTED. CPython's C-level handler still writes the
signal's number to the wakeup fd, from whichever thread takes the signal; a watcher thread reads it and
cancels the jobs, and the call returns with an error that `SignalWatch.check` tells from a real failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

INTERRUPTED = "interrupted by a signal: the Spark job in flight was cancelled"


class SignalWatch:
    """Whether SIGINT or SIGTERM arrived while a `spark_jobs_cancelled_on_interrupt` block ran."""

    def __init__(self) -> None:
        self.seen = threading.Event()

    def check(self) -> None:
        """KeyboardInterrupt if a signal came: a Spark job then ended in a cancellation error, which the
        caller would otherwise take for a failure of its work and go on (a run worker's op turns it into
        its interrupted failure: runstate.defs.runs.interrupts)."""
        if self.seen.is_set():
            raise KeyboardInterrupt(INTERRUPTED)


@contextmanager
def spark_jobs_cancelled_on_interrupt(
    session: SparkSession | None = None, *, silent_once_cancelled: bool = False
) -> Iterator[SignalWatch]:
    """While the block runs, SIGINT or SIGTERM cancels the session's Spark jobs (no session: those of the
    process's Spark context, if one started by then: a worker that builds its session lazily). The
    signals' own handlers are left as they are (Dagster's in a run worker, the CLI's).

    `silent_once_cancelled`: the JVM logs nothing more after it cancels, for a process that ends with
    the interrupt (a CLI command): the cancelled tasks' ERROR lines and stack traces are not its errors."""
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
                    context = _spark_context(session)
                    if silent_once_cancelled:
                        _jvm_logs_off(context)
                    context.cancelAllJobs()

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


def _jvm_logs_off(context: Any) -> None:
    """Every JVM logger off, those with a level of their own too (SparkContext.setLogLevel sets the root's
    only, and the driver's log configuration names some: runstate/spark_log4j2.properties)."""
    log4j = context._jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setAllLevels(log4j.LogManager.ROOT_LOGGER_NAME, log4j.Level.OFF)
