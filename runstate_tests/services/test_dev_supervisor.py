"""The `runstate dev` supervisor without Dagster: signals are forwarded, leftovers in the group are swept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runstate.services.state import process_start_time

# Stands in for `dagster dev`: starts a long-lived grandchild (a code server), then on SIGINT or
# SIGTERM exits 0 without stopping it, like a dev process whose code server waits out a heartbeat.
FAKE_DAGSTER_DEV = textwrap.dedent("""
    import signal, subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(grandchild.pid, flush=True)
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(1)
""")

SUPERVISOR = textwrap.dedent("""
    import subprocess, sys
    from runstate.services.dev import _child_setup, supervise
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True,
                             preexec_fn=_child_setup)
    print(child.pid, flush=True)
    sys.exit(supervise(child))
""")


def _catches_int_and_term(pid: int) -> bool:
    """True once the supervisor has installed its handlers (SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            caught = int(line.split()[1], 16)
            return all(caught & (1 << (s - 1)) for s in (signal.SIGINT, signal.SIGTERM))
    return False


def _ignore_int_and_term() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `runstate dev &` would start
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_is_forwarded_and_the_process_group_is_swept(sig, tmp_path: Path):
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, FAKE_DAGSTER_DEV],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_int_and_term,
    )
    try:
        supervisor.stdout.readline()  # the child's pid
        grandchild = int(supervisor.stdout.readline())
        assert process_start_time(grandchild) is not None
        deadline = time.monotonic() + 300  # generous: a loaded machine, not a slow supervisor, sets the pace
        while not _catches_int_and_term(supervisor.pid):
            assert time.monotonic() < deadline, "the supervisor never installed its signal handlers"
            time.sleep(
                0.05
            )  # the handlers go in right after the child starts; a signal before that is ignored

        supervisor.send_signal(sig)

        assert supervisor.wait(timeout=300) == 0
        assert process_start_time(grandchild) is None
    finally:
        if supervisor.poll() is None:
            supervisor.kill()


def test_dagster_dev_stops_when_its_supervisor_is_killed_outright():
    """SIGKILL to `runstate dev` alone must not leave `dagster dev` running in its own session."""
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, FAKE_DAGSTER_DEV], stdout=subprocess.PIPE, text=True
    )
    child = int(supervisor.stdout.readline())
    grandchild = int(supervisor.stdout.readline())  # printed once the child runs its own code
    try:
        supervisor.kill()
        supervisor.wait(timeout=60)

        deadline = time.monotonic() + 60
        while process_start_time(child) is not None:
            assert time.monotonic() < deadline, "dagster dev outlived its killed supervisor"
            time.sleep(0.1)
    finally:
        for pid in (child, grandchild):  # the fake leaves its grandchild, as it does on any signal
            if process_start_time(pid) is not None:
                os.kill(pid, signal.SIGKILL)
