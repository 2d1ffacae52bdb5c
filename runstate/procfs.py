"""What /proc says of a process: its stat fields, whether it is alive, and the processes below it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PROC = Path("/proc")


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None when it is gone."""
    try:
        return (PROC / f"{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"  # a zombie has ended; only its parent's wait is left


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, whatever its session or group."""
    children: dict[int, list[int]] = {}
    # os.listdir and a binary read, not Path.glob and read_text: it reads every process's stat, and the
    # deployment tests' samplers call it up to 5 times a second (88 processes: 2.3 ms of CPU, not 5.5).
    for name in os.listdir(PROC):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"{PROC}/{name}/stat", "rb") as stat:
                parent = int(stat.read().rsplit(b")", 1)[1].split(None, 2)[1])
            children.setdefault(parent, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
