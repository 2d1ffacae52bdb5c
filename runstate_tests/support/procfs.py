"""What /proc says of live processes, for tests that check what a command left running."""

from __future__ import annotations

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
