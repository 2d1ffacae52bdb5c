"""Supervise `dagster dev` (webserver + daemon) for `runstate dev`: no Dagster import, just a child process.

The child gets default SIGINT/SIGTERM dispositions (a parent started with `&` would hand it SIGINT
ignored, and Dagster maps SIGTERM onto SIGINT's handler) and a session of its own, so a terminal's
Ctrl-C reaches it once, through us. We forward SIGINT/SIGTERM, wait for a clean shutdown, and only
kill the process group when it overstays the grace period or a second signal arrives.

Once told to stop, the deployment launches nothing more (the file named by RUNSTATE_DEV_STOPPING_FILE
appears, and `HeartbeatRunLauncher` refuses launches while it exists), and every run worker gets SIGTERM
at once, including one that starts later: `dagster dev` stops its servers but never signals their runs,
and a run worker told to stop ends its run and records that before it exits.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from runstate.config import project_home
from runstate.services.state import (
    LOOPBACK,
    ServiceError,
    default_signal_dispositions,
    find_binary,
    require_free_port,
)

SHUTDOWN_GRACE_SECONDS = 60.0
STOPPING_FILE_ENV = "RUNSTATE_DEV_STOPPING_FILE"


def repo_root() -> Path:
    """The checkout holding dagster.yaml and workspace.yaml (the installed package sits inside it)."""
    checkout = Path(__file__).resolve().parents[2]
    return checkout if (checkout / "dagster.yaml").exists() else project_home()


def dagster_home(environ: Mapping[str, str]) -> Path:
    return Path(environ["DAGSTER_HOME"]) if environ.get("DAGSTER_HOME") else repo_root()


def dagster_dev_argv(port: int, root: Path) -> list[str]:
    try:
        dagster = [str(find_binary("dagster", hint=""))]
    except ServiceError:
        dagster = [sys.executable, "-m", "dagster"]
    workspace = root / "workspace.yaml"
    target = ["-w", str(workspace)] if workspace.exists() else ["-m", "runstate.definitions"]
    return [*dagster, "dev", "-h", LOOPBACK, "-p", str(port), *target]


def run_dagster_dev(port: int, environ: Mapping[str, str]) -> int:
    """Run `dagster dev` until it exits or we are told to stop; returns the exit code to use."""
    require_free_port("dagster dev", port, "--port")
    env = dict(environ)
    env.setdefault("DAGSTER_HOME", str(dagster_home(environ)))
    env.setdefault("DAGSTER_TELEMETRY_ENABLED", "false")
    # In the project home, where `.env` lives: Dagster's CLI loads `.env` from its working folder (over the
    # environment), so it must be this project's block, never another checkout's.
    home = project_home()
    home.mkdir(parents=True, exist_ok=True)
    stopping = Path(tempfile.gettempdir()) / f"runstate-dev-{os.getpid()}.stopping"
    stopping.unlink(missing_ok=True)
    env[STOPPING_FILE_ENV] = str(stopping)
    child = subprocess.Popen(
        dagster_dev_argv(port, repo_root()),
        cwd=home,
        env=env,
        start_new_session=True,
        preexec_fn=_child_setup,
    )
    try:
        return supervise(child, stopping)
    finally:
        stopping.unlink(missing_ok=True)


PR_SET_PDEATHSIG = 1


def _child_setup() -> None:
    """In the child before exec: default dispositions, and SIGTERM when its supervisor dies.

    `runstate dev` killed outright (SIGKILL, OOM) would otherwise leave `dagster dev` running in its own
    session, a deployment nobody can see; with the death signal it shuts down as on a Ctrl-C.
    """
    default_signal_dispositions()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def supervise(child: subprocess.Popen, stopping: Path | None = None) -> int:
    signals_seen: list[int] = []
    told: set[int] = set()  # the run workers sent SIGTERM

    def forward(signum: int, _frame: object) -> None:
        signals_seen.append(signum)
        if len(signals_seen) == 1:
            if stopping is not None:
                stopping.touch()
            _signal_child(child, signum)
        else:  # a second Ctrl-C means "now"
            _kill_group(child)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        deadline: float | None = None
        while True:
            try:
                code = child.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            if signals_seen and deadline is None:
                deadline = time.monotonic() + SHUTDOWN_GRACE_SECONDS
            if signals_seen:
                _stop_run_workers(child.pid, told)
            if deadline is not None and time.monotonic() > deadline:
                _kill_group(child)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _sweep_group(child, told)
    # Asked to stop and it stopped: that is a clean exit whatever code the child chose for it.
    return 0 if signals_seen else code


def _sweep_group(child: subprocess.Popen, told: set[int], grace: float = 20.0) -> None:
    """Stop whatever dagster dev left in its process group (a code server waiting out its heartbeat).

    The group is the session we created for dagster dev, so it holds nothing but its descendants.
    They get SIGTERM, a grace period to finish, then SIGKILL; we return only once the group is empty.
    A run worker that a code server spawns during the grace period gets SIGTERM too, so it records its
    run's end instead of being killed with it left STARTED.
    """
    members = _group_members(child.pid)
    if not members:
        return
    _kill_group(child, signal.SIGTERM)
    told.update(members)
    deadline = time.monotonic() + grace
    while _group_members(child.pid) and time.monotonic() < deadline:
        _stop_run_workers(child.pid, told)
        time.sleep(0.2)
    _kill_group(child, signal.SIGKILL)


def _group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def _is_run_worker(pid: int) -> bool:
    """A code server starts each run in a process of Python's multiprocessing `spawn` (its only such child)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"--multiprocessing-fork" in argv


def _stop_run_workers(pgid: int, told: set[int]) -> None:
    """SIGTERM each run worker of the group once, those that start after the shutdown began included."""
    for pid in _group_members(pgid):
        if pid not in told and _is_run_worker(pid):
            told.add(pid)
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def _signal_child(child: subprocess.Popen, signum: int) -> None:
    try:
        child.send_signal(signum)
    except ProcessLookupError:
        pass


def _kill_group(child: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass
