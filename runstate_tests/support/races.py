"""Real processes for races, and their outcomes."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import queue
import time
from typing import Any

# The modules whose functions the suite's racing processes run: the fork server imports them once.
RACER_MODULES = [
    "runstate_tests.eventstore.test_concurrency",
    "runstate_tests.maintenance.test_store_queue",
    "runstate_tests.migrations.test_migrations",
]


def racing_processes() -> multiprocessing.context.ForkServerContext:
    """Real processes for races, each forked from one server per test worker that imported runstate and
    the racers' modules once. Spawned, each child imported them itself: about a CPU-second per process,
    54 per suite. The fork server is a fresh single-threaded interpreter, so forking it is safe where
    forking a test worker (its pools', Spark's and Dagster's threads) is not."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(RACER_MODULES)
    return context


def race_outcomes(results: Any, workers: list[Any], count: int, timeout: float = 600) -> list[Any]:
    """`count` items from the racers' `results` queue. A racer that died fails the test at once, naming
    its exit code (its traceback is in the captured stderr), instead of after `timeout`."""
    outcomes: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(outcomes) < count:
        try:
            outcomes.append(results.get(timeout=1))
        except queue.Empty:
            died = [worker.exitcode for worker in workers if worker.exitcode not in (None, 0)]
            assert not died, f"a racer died (exit codes {died}) after {len(outcomes)} of {count} outcomes"
            assert time.monotonic() < deadline, f"{len(outcomes)} of {count} outcomes in {timeout:.0f} s"
    return outcomes
