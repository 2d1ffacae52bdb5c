"""Bookkeeping for the embedded dev services: `.runstate/services.json`, pids and ports.

Everything here is plain process management (no Dagster). A service that `up` started is
recorded with its pid and the pid's start time, so `down` signals exactly that process and never
a stranger that reused the pid, nor a server the machine runs on its own.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from runstate.config import state_dir

LOOPBACK = "127.0.0.1"
SERVICE_NAMES = ("postgres", "moto", "fakesnow")

# Where a service came from: only "embedded" ones were started by `up`, and only those are stopped by `down`.
EMBEDDED = "embedded"
MACHINE = "machine"
EXTERNAL = "external"
# Files that may hold a password (services.json, a new `.env`): read and written by their owner only.
SECRET_FILE_MODE = 0o600


class ServiceError(RuntimeError):
    """A service cannot be started or reached; the message says what to do about it."""


@dataclass
class ServiceRecord:
    name: str
    kind: str
    url: str
    port: int | None = None
    pid: int | None = None
    pid_start: int | None = None
    log: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def started_by_us(self) -> bool:
        return self.kind == EMBEDDED and self.pid is not None


def services_file() -> Path:
    return state_dir() / "services.json"


def logs_dir() -> Path:
    return state_dir() / "logs"


def load_records() -> dict[str, ServiceRecord]:
    path = services_file()
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    return {name: ServiceRecord(**record) for name, record in raw.items() if name in SERVICE_NAMES}


def save_records(records: Mapping[str, ServiceRecord]) -> None:
    """The records, readable by their owner only: a service's URL may carry its password."""
    path = services_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({name: asdict(r) for name, r in records.items()}, indent=2) + "\n"
    atomic_write(path, text, mode=SECRET_FILE_MODE)


def atomic_write(path: Path, text: str, *, mode: int | None = None) -> None:
    """Replace `path` with `text` at once (a reader, a test worker or dagster, never sees half a file).

    The new file has `mode` when given; otherwise the mode of the file it replaces (a user's 0600 `.env`
    stays 0600), and a new file is the owner's alone (SECRET_FILE_MODE): what we write may hold a password.
    """
    if mode is None:
        mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else SECRET_FILE_MODE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # Created with no access for others, so the text is never readable by them, not even for a moment.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            os.fchmod(handle.fileno(), mode)  # the umask does not apply to fchmod
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def services_lock() -> Iterator[None]:
    """Serialise `up` and `down` across processes (make test and runstate dev may race)."""
    state_dir().mkdir(parents=True, exist_ok=True)
    with open(state_dir() / "services.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ----- ports


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def port_answers(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_is_free(port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def require_free_port(service: str, port: int, option: str) -> None:
    if not port_is_free(port):
        raise ServiceError(
            f"{service}: port {port} on {LOOPBACK} is taken by another process. "
            f"Stop whatever listens there (`ss -ltnp 'sport = :{port}'` shows it), "
            f"or pass another {option}, or leave {option} out to pick a free port."
        )


# ----- binaries


def find_binary(name: str, *, extra_dirs: Sequence[Path] = (), hint: str) -> Path:
    """The venv's own scripts first (moto_server, fakesnow, dagster), then extra_dirs, then PATH."""
    for folder in (Path(sys.executable).parent, *extra_dirs):
        candidate = folder / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found:
        return Path(found)
    raise ServiceError(
        f"`{name}` was not found (looked in {Path(sys.executable).parent}, "
        f"{', '.join(str(d) for d in extra_dirs) or 'no extra folders'} and PATH). {hint}"
    )


# ----- processes


def default_signal_dispositions() -> None:
    # A process started from a shell with `&` inherits SIGINT ignored, and Python/Dagster map SIGTERM
    # onto SIGINT's handler, so the child would ignore both: give it the default dispositions back.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def spawn_detached(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    user: str | None = None,
) -> subprocess.Popen:
    """Start a service that outlives this CLI process: its own session, default signals, output to a log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            close_fds=True,
            start_new_session=True,
            preexec_fn=default_signal_dispositions,
            user=user,
        )


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks after boot): with the pid, it names one process for ever."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses; the fields after the last ')' are fixed.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie has exited; only its exit status is left
        return None
    return int(fields[19])


def _same_process(pid: int, pid_start: int | None) -> bool:
    started = process_start_time(pid)
    return started is not None and (pid_start is None or started == pid_start)


def is_running(record: ServiceRecord) -> bool:
    return record.pid is not None and _same_process(record.pid, record.pid_start)


def stop_process(
    pid: int, pid_start: int | None, *, sig: int = signal.SIGTERM, timeout: float = 20.0
) -> bool:
    """Signal one recorded process, wait for it to go, SIGKILL as a last resort; False if it was gone."""
    if not _same_process(pid, pid_start):
        return False
    os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not _same_process(pid, pid_start):
            return True
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    _reap(pid)
    return True


def _reap(pid: int) -> None:
    # When this very process started the service (runstate dev, tests), collect its exit status.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def log_tail(path: Path | str | None, lines: int = 15) -> str:
    if not path or not Path(path).exists():
        return "(no log)"
    text = Path(path).read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def wait_until(
    check, *, timeout: float, process: subprocess.Popen | None = None, what: str, log: Path | None = None
) -> None:
    """Poll a readiness check; fail fast with the log tail when the process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if process is not None and process.poll() is not None:
            raise ServiceError(
                f"{what} exited with code {process.returncode} while starting; last log lines:\n"
                f"{log_tail(log)}"
            )
        time.sleep(0.2)
    raise ServiceError(f"{what} did not become ready within {timeout:.0f}s; last log lines:\n{log_tail(log)}")


def embedded_service(
    name: str,
    previous: ServiceRecord | None,
    *,
    port: int | None,
    port_option: str,
    argv: Callable[[int], list[str]],
    healthy: Callable[[str], bool],
) -> ServiceRecord:
    """Reuse a healthy embedded server of ours, else start one detached on the asked, previous or a port."""
    if previous and previous.kind == EMBEDDED and is_running(previous) and healthy(previous.url):
        return previous
    if port:
        require_free_port(name, port, port_option)
    elif previous and previous.port and port_is_free(previous.port):
        port = previous.port
    else:
        port = free_port()
    log = logs_dir() / f"{name}.log"
    process = spawn_detached(argv(port), log_path=log)
    return started_record(name, f"http://{LOOPBACK}:{port}", port, process, log, healthy)


def started_record(
    name: str,
    url: str,
    port: int,
    process: subprocess.Popen,
    log: Path,
    healthy: Callable[[str], bool],
    extra: dict[str, str] | None = None,
) -> ServiceRecord:
    """Wait until the server just started answers at `url`, then the record that finds it again."""
    wait_until(lambda: healthy(url), timeout=60, process=process, what=name, log=log)
    return service_record(name, url, port, process, log, extra)


def service_record(
    name: str, url: str, port: int, process: subprocess.Popen, log: Path, extra: dict[str, str] | None = None
) -> ServiceRecord:
    """The record of an embedded service that answers: enough to find the very same process again."""
    return ServiceRecord(
        name,
        EMBEDDED,
        url,
        port=port,
        pid=process.pid,
        pid_start=process_start_time(process.pid),
        log=str(log),
        extra=extra or {},
    )


def external_record(service: str, url: str, *, answers: bool, fix: str) -> ServiceRecord:
    """A server the caller named in the environment: used as it is, never started or stopped by us."""
    if not answers:
        raise ServiceError(f"{service}: {fix}")
    return ServiceRecord(service, EXTERNAL, url)


def require_module(service: str, modules: tuple[str, ...], brings: str) -> None:
    """The embedded server runs from this Python: its packages must be installed here.

    Found, not imported: `up` runs the server in a process of its own, and importing fakesnow and moto
    here cost a second of CPU at every `up`."""
    if any(importlib.util.find_spec(module) is None for module in modules):
        raise ServiceError(
            f"{service}: not installed in this Python; run "
            f"`pip install -c requirements.lock -e '.[dev]'` (it brings {brings})."
        )
