"""The process behind a run, so that a run declared dead is ended with everything it started.

A run worker frozen past the dead bound (SIGSTOP, a stuck VM) is reported failed, which frees its Spark
pool slot, yet its Spark JVM, a child process of the worker, goes on running the job it was given: a new
run then starts a JVM beside it, over the pool's limit. (A worker that ends frees its JVM: PySpark's
gateway exits when its stdin, the worker's pipe, closes. A frozen one keeps the pipe open.) So each
run worker records where it runs (`this_process`; a CLI's in-process run does not: its fence ends it with
exit code 1), and whoever declares its run dead ends that process and every process below it
(`end_process`), JVM included, before it frees the run's slots.

Pids name processes only within one pid namespace of one boot of one machine: a record made elsewhere
(another host, another container, an earlier boot) is never acted on, and neither is a pid that now
names another process (its start time differs) or the caller itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from dataclasses import dataclass

from runstate.procfs import PROC, alive, descendants, stat_fields

# How long the ended processes are given to be gone (SIGKILL takes effect at once, even on a stopped one).
GONE_WITHIN_S = 10.0


@dataclass(frozen=True)
class WorkerProcess:
    """Where a run's process runs: its machine (boot and pid namespace), pid and start time."""

    host: str
    pid: int
    started: int  # clock ticks after boot (/proc/PID/stat field 22): tells a reused pid apart

    def as_text(self) -> str:
        return f"{self.host} {self.pid} {self.started}"

    @classmethod
    def from_text(cls, text: str) -> WorkerProcess | None:
        try:
            host, pid, started = text.rsplit(" ", 2)
            return cls(host, int(pid), int(started))
        except ValueError:  # a value not written by us
            return None


def host_key() -> str | None:
    """This machine's boot and pid namespace, plus its name (for people): None where /proc cannot say."""
    try:
        boot = (PROC / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink(PROC / "self/ns/pid")
    except OSError:
        return None
    return f"{socket.gethostname()}/{boot}/{namespace}".replace(" ", "_")


def _start_ticks(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[19]) if fields else None  # field 22 of the whole line


def this_process() -> WorkerProcess | None:
    """This process as a run worker's record; None where it cannot be told apart safely."""
    host, started = host_key(), _start_ticks(os.getpid())
    return WorkerProcess(host, os.getpid(), started) if host and started is not None else None


def ended_here(worker: WorkerProcess) -> bool:
    """Whether the recorded process is known to have ended: it ran on this machine (this boot, this pid
    namespace) and its pid no longer names it (gone, a zombie, or reused). Anywhere else nothing is
    known, and a frozen process has not ended."""
    if worker.host != host_key() or worker.pid == os.getpid():
        return False
    return not alive(worker.pid) or _start_ticks(worker.pid) != worker.started


def end_process(worker: WorkerProcess) -> str:
    """SIGKILL the recorded process and every process below it, if it is this machine's and still the
    same process, and wait until they are gone. Returns what was done, for the run's failure message."""
    if worker.host != host_key():
        return f"its process {worker.pid} runs on another host ({worker.host.split('/')[0]}), left alone"
    if worker.pid == os.getpid() or _start_ticks(worker.pid) != worker.started:
        return f"its process {worker.pid} had already ended"
    tree = [*descendants(worker.pid), worker.pid]  # read first: the children are orphaned once it dies
    if os.getpid() in tree:  # the caller runs below the run's process (an in-process tick): its fence acts
        return f"its process {worker.pid} runs above this one, left to its own fence"
    for pid in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # one left alive is reported
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + GONE_WITHIN_S
    while any(alive(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in tree if alive(pid)]
    if left:
        return f"its process {worker.pid} was killed, but {len(left)} of its processes did not end"
    return f"its process {worker.pid} and the {len(tree) - 1} below it (a Spark JVM among them) were killed"
