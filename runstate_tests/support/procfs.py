"""What /proc says of live processes, for tests that check what a command left running."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def command_line(pid: int) -> str:
    """The process's command line, its arguments joined by spaces; "" once it is gone."""
    try:
        return (
            (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def processes_marked(mark: str) -> list[int]:
    """The processes whose environment holds `mark` (a command and what it started inherit it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
            except OSError:  # gone, or not ours to read
                continue
    return pids


def kill_marked(mark: str) -> None:
    """SIGKILL what `processes_marked` finds: a failed test's command and its JVM must not outlive it."""
    for pid in processes_marked(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


def thread_names(pid: int) -> list[str]:
    """The names of the process's threads as Linux shows them (a Java thread's name, cut to 15 bytes);
    [] once it is gone."""
    names = []
    try:
        tasks = list((Path("/proc") / str(pid) / "task").iterdir())
    except OSError:
        return []
    for task in tasks:
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:  # the thread ended
            continue
    return names
