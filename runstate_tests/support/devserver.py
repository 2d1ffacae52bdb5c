"""Helpers for tests (and benches) that start `runstate dev`: launching it, a free port, a GraphQL probe."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from runstate.procfs import descendants

RUNSTATE = str(Path(sys.executable).parent / "runstate")


def launch_dev(port: int, env: dict[str, str], log: Path, **popen: Any) -> subprocess.Popen:
    """`runstate dev --port PORT` in the background, its output in `log`; `popen` adds Popen options."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [RUNSTATE, "dev", "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT, **popen
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def graphql_version(port: int) -> str | None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": "{version}"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)["data"]["version"]
    except (urllib.error.URLError, OSError, KeyError, ValueError):
        return None


def wait_for_graphql(port: int, process, timeout: float = 420) -> str | None:
    """Poll until the webserver of `process` answers on `port` (no tick to drive there), or it exits.

    The bound is no latency claim: on a 2-core host at a load of 25 (the suite's three workers in the
    demo, the deployment tests and the racing exports at once) `runstate dev` took over 180 s to answer.

    None as well when another process listens on the port: `free_port()` can hand one port to two
    callers at once, and a Dagster webserver of another test answering there looks healthy (seen twice:
    a restart test that read another server's runs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        version = graphql_version(port)
        if version is not None:
            return version if listening_pids(port) & {process.pid, *descendants(process.pid)} else None
        time.sleep(0.5)
    return None


def listening_pids(port: int) -> set[int]:
    """The processes holding a listening TCP socket on `port` (read from /proc: Linux, this machine)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    return {
        int(proc.name)
        for proc in Path("/proc").iterdir()
        if proc.name.isdigit() and _fd_targets(proc) & inodes
    }


def _fd_targets(proc: Path) -> set[str]:
    """What the process's descriptors point to; empty once it has exited. (A glob over /proc/*/fd/* raises
    when a process exits between the listing of /proc and the reading of its fd folder.)"""
    try:
        fds = list((proc / "fd").iterdir())
    except OSError:
        return set()
    targets = set()
    for fd in fds:
        with contextlib.suppress(OSError):
            targets.add(os.readlink(fd))
    return targets


def graphql(port: int, query: str, variables: dict | None = None, timeout: float = 60) -> dict:
    """One GraphQL call to the webserver; raises on transport errors and on GraphQL errors."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = json.load(response)
    if body.get("errors"):
        raise AssertionError(f"GraphQL errors: {body['errors']}")
    return body["data"]


def poll(check, *, timeout: float, every: float = 1.0, what: str):
    """Call check() until it returns something truthy; the last value goes into the failure message."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")
