"""`bench/wal.py --daemon`: append -> visible lag through the real daemon, and where the time goes.

Starts a `runstate dev` of its own, appends --daemon-rows rows at random moments over --daemon-seconds
to --daemon-datasets datasets, and polls every dataset's manifest until each row is visible. For each
row the flush run that made it visible is found (its shard's run whose step was running when the row
appeared), and the lag is split into: sensor_tick_s (append -> the run was requested; 0 when the run
was already requested and picked the row up on its way), queue_wait_s, run_start_s (dequeued -> the
flush step starts: process start and code-location load) and flush_s (step start, or the append if
later -> row visible). Each counts only the time after the append, so a row that a lingering run takes
up shows no tick, queue or start.
Baseline, same run: direct_flush_s, a shard flush of one appended row called in-process (no daemon).
Floor: lag_p99_s <= 45; goal <= 35.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from typing import Any

from wal_devserver import RunTiming, flush_runs, load_average, median, percentile, start_dev
from wal_fanout import Target

from runstate.wal import Batch, Change, WalTable
from runstate.wal.shards import flush_shard, shard_of

POLL_S = 0.5


def add_arguments(parser: Any) -> None:
    parser.add_argument(
        "--daemon", action="store_true", help="measure through `runstate dev` (see bench/wal_daemon.py)"
    )
    parser.add_argument(
        "--daemon-rows", type=int, default=240, help="rows appended in --daemon mode (default 240)"
    )
    parser.add_argument(
        "--daemon-seconds", type=float, default=300.0, help="window of the appends (default 300 s)"
    )
    parser.add_argument(
        "--daemon-datasets", type=int, default=12, help="datasets the rows go to (default 12)"
    )


def append_at_random_moments(
    target: Target,
    datasets: list[str],
    offsets: list[float],
    start: float,
    appended: dict[tuple[str, int], float],
) -> None:
    for i, offset in enumerate(offsets):
        time.sleep(max(0.0, start + offset - time.time()))
        dataset_id = datasets[i % len(datasets)]
        seq = target.producer.append(dataset_id, [Change.upsert(f"r{i}", i)])
        appended[(dataset_id, seq)] = time.time()


def mark_visible(
    target: Target,
    datasets: list[str],
    appended: dict[tuple[str, int], float],
    seen: dict[tuple[str, int], float],
) -> None:
    """One poll of the applied seqs (one Query): note when each appended row is first seen."""
    applied, now = target.applied(), time.time()
    for key in list(appended):
        if key not in seen and key[1] <= applied.get(key[0], 0):
            seen[key] = now


def poll_visibility(
    target: Target,
    datasets: list[str],
    appended: dict[tuple[str, int], float],
    seen: dict[tuple[str, int], float],
    done: threading.Event,
) -> None:
    while not done.is_set():
        mark_visible(target, datasets, appended, seen)
        done.wait(POLL_S)


def run_of(row: tuple[str, int], visible_at: float, shards: int, runs: list[RunTiming]) -> RunTiming | None:
    """The flush run of the row's shard whose step was running when the row became visible."""
    shard = str(shard_of(row[0], shards))
    for run in runs:
        if run.shard == shard and run.step_started is not None and run.ended is not None:
            if run.step_started - POLL_S <= visible_at <= run.ended + 2 * POLL_S:
                return run
    return None


def breakdown(appended: dict, seen: dict, shards: int, runs: list[RunTiming]) -> dict[str, Any]:
    parts: dict[str, list[float]] = {
        "sensor_tick_s": [],
        "queue_wait_s": [],
        "run_start_s": [],
        "flush_s": [],
    }
    unattributed = 0
    for row, visible_at in seen.items():
        run = run_of(row, visible_at, shards, runs)
        if run is None or run.dequeued is None or run.started is None or run.step_started is None:
            unattributed += 1
            continue
        # Only the part of each stage after the row's append counts: a row that arrives while its run
        # lingers waits for no tick, queue or run start at all.
        at = appended[row]
        parts["sensor_tick_s"].append(max(0.0, run.created - at))
        parts["queue_wait_s"].append(max(0.0, run.dequeued - max(at, run.created)))
        parts["run_start_s"].append(max(0.0, run.step_started - max(at, run.dequeued)))
        parts["flush_s"].append(max(0.0, visible_at - max(run.step_started, at)))
    result: dict[str, Any] = {f"{name}_p50": median(values) for name, values in parts.items()}
    result.update(
        {f"{name}_p99": round(percentile(values, 0.99), 2) for name, values in parts.items() if values}
    )
    result["rows_unattributed"] = unattributed
    return result


def direct_flush_s(target: Target, table: WalTable, rounds: int = 10) -> float:
    """The baseline: append one row and flush it in-process right away (no sensor, queue or run worker)."""
    durations = []
    for i in range(rounds):
        seq = target.producer.append("direct-baseline", [Change.upsert("k", i)])
        started = time.perf_counter()
        flush_shard(table, target.blobs, [Batch("direct-baseline", (seq,))])
        durations.append(time.perf_counter() - started)
    return median(durations) or 0.0


def main(args: Any) -> dict[str, Any]:
    rng = random.Random(args.seed)
    result: dict[str, Any] = {"bench": "wal_daemon", "load_avg_start": load_average()}
    with contextlib.contextmanager(start_dev)() as dev:
        from runstate.config import Settings

        shards = Settings.from_env(dev.env).wal_flush_shards
        target, instance = Target(dev), dev.instance()
        table = WalTable(target.producer.dynamodb, target.producer.table)
        datasets = [f"lag{i:02d}-{int(time.time())}" for i in range(args.daemon_datasets)]
        warm = {}
        append_at_random_moments(target, datasets[:1], [0.0], time.time(), warm)  # first run: one-off costs
        poll_visibility_until(target, datasets[:1], warm, time.time() + 240)
        offsets = sorted(rng.uniform(0, args.daemon_seconds) for _ in range(args.daemon_rows))
        appended: dict[tuple[str, int], float] = {}
        seen: dict[tuple[str, int], float] = {}
        done = threading.Event()
        start = time.time()
        appender = threading.Thread(
            target=append_at_random_moments, args=(target, datasets, offsets, start, appended)
        )
        reader = threading.Thread(target=poll_visibility, args=(target, datasets, appended, seen, done))
        appender.start()
        reader.start()
        appender.join()
        deadline = time.time() + 240
        while len(seen) < len(appended) and time.time() < deadline:
            time.sleep(POLL_S)
        done.set()
        reader.join()
        wait_for_flush_runs(instance, time.time() + 300)  # a lingering run ends after its idle time
        runs = flush_runs(instance, start - 60)
        baseline = direct_flush_s(target, table)
    if len(seen) < len(appended):
        raise SystemExit(f"{len(appended) - len(seen)} of {len(appended)} appended rows never became visible")
    lags = [seen[row] - appended[row] for row in appended]
    result.update(
        {
            "lag_rows": len(lags),
            "window_s": args.daemon_seconds,
            "lag_p50_s": round(percentile(lags, 0.5), 2),
            "lag_p99_s": round(percentile(lags, 0.99), 2),
            "lag_max_s": round(max(lags), 2),
            "flush_runs": len([run for run in runs if run.created >= start]),
            "shards": shards,
            "direct_flush_s": round(baseline, 3),
            "load_avg_end": load_average(),
            "floor_met": percentile(lags, 0.99) <= 45.0,
            **breakdown(appended, seen, shards, runs),
        }
    )
    return result


def wait_for_flush_runs(instance: Any, deadline: float) -> None:
    import dagster as dg

    status = dg.DagsterRunStatus
    in_progress = [status.QUEUED, status.NOT_STARTED, status.STARTING, status.STARTED, status.CANCELING]
    alive = dg.RunsFilter(job_name="flush_wal", statuses=in_progress)
    while instance.get_run_records(filters=alive, limit=1) and time.time() < deadline:
        time.sleep(1.0)


def poll_visibility_until(target: Target, datasets: list[str], appended: dict, deadline: float) -> None:
    seen: dict = {}
    while len(seen) < len(appended) and time.time() < deadline:
        mark_visible(target, datasets, appended, seen)
        time.sleep(POLL_S)
