"""Shared by the Postgres benchmarks: a scratch database per run, and timed worker threads."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable

import psycopg
from psycopg import sql


def create_database(admin_url: str) -> tuple[str, str]:
    """Create `rs_bench_<random>`; returns (name, DSN)."""
    name = f"rs_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name, f"{admin_url.rpartition('/')[0]}/{name}"


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def timed_threads(workers: int, work: Callable[[int, threading.Barrier], None]) -> float:
    """Run work(index, start) on `workers` threads; each waits on `start` once it is ready, so the
    clock covers only the work. Returns the seconds from the common start until the last one ends.
    A worker that raises breaks the barrier (nobody waits for it) and its error is raised here."""
    start = threading.Barrier(workers + 1)
    failures: list[BaseException] = []

    def guarded(index: int) -> None:
        try:
            work(index, start)
        except threading.BrokenBarrierError:
            pass  # another worker failed first: its error is the one to report
        except BaseException as exc:
            failures.append(exc)
            start.abort()

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    try:
        start.wait()
    except threading.BrokenBarrierError:
        pass
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"{len(failures)} of {workers} bench worker(s) failed") from failures[0]
    return time.perf_counter() - began


# Above this 1-minute load average a run is not quiet: other work shares the cores, every ratio drifts.
QUIET_LOAD = 1.0


def load_start() -> dict[str, float | bool]:
    """The load at a bench's start and whether it counts as quiet; add `load_end()` at its end."""
    load = round(os.getloadavg()[0], 2)
    return {"load_start": load, "quiet": load <= QUIET_LOAD}


def load_end() -> dict[str, float]:
    return {"load_end": round(os.getloadavg()[0], 2)}
