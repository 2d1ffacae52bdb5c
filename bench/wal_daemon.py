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

Idle gaps (issue 52): then, for each of --daemon-idle-gaps (default 30,120,600 s), nothing is appended
for that long, then a burst of one row per dataset: `idle_gaps` gives each burst's lag (p50, max) and the
flush runs started for it. While idle, the live flush runs' processes are sampled every 10 s: `idle_cost`
is their count, RSS and CPU (the price of RUNSTATE_WAL_FLUSH_MODE=always-on; run it once per mode).
--quick: 24 rows over 30 s, gaps of 10 and 30 s.
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
    parser.add_argument(
        "--daemon-idle-gaps",
        default="30,120,600",
        help="idle seconds before each burst, comma-separated; empty: no idle phase (default 30,120,600)",
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the appends' random moments")
    parser.add_argument(
        "--quick", action="store_true", help="--daemon: 24 rows over 30 s and idle gaps of 10 and 30 s"
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


def idle_gaps(args: Any) -> list[float]:
    raw = "10,30" if args.quick else args.daemon_idle_gaps
    try:
        gaps = [float(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(
            f"Error: --daemon-idle-gaps must be seconds separated by commas, got {raw!r}"
        ) from None
    if any(gap < 0 for gap in gaps):
        raise SystemExit(f"Error: --daemon-idle-gaps must not be negative, got {raw!r}")
    return gaps


def live_run_processes(instance: Any) -> dict[str, int]:
    """run id -> pid of each flush run in progress (where it recorded itself when it began to beat)."""
    import dagster as dg

    from runstate.defs.runs.beats import worker_of
    from runstate.defs.runs.workers import WorkerProcess

    started = dg.RunsFilter(job_name="flush_wal", statuses=[dg.DagsterRunStatus.STARTED])
    pids = {}
    for record in instance.get_run_records(filters=started):
        text = worker_of(instance, record.dagster_run.run_id)
        worker = WorkerProcess.from_text(text) if text else None
        if worker is not None:
            pids[record.dagster_run.run_id] = worker.pid
    return pids


def cpu_and_rss(pid: int) -> tuple[float, int] | None:
    """CPU seconds so far and resident bytes, from /proc; None once the process is gone."""
    import os

    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return cpu_s, int(fields[21]) * os.sysconf("SC_PAGE_SIZE")


class IdleCost:
    """Samples of the live flush runs' processes, taken while nothing is appended."""

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.rss: list[int] = []
        self.cpu_rates: list[float] = []
        self._last: dict[int, tuple[float, float]] = {}  # pid -> (when, CPU seconds)

    def sample(self, instance: Any) -> None:
        pids, now = live_run_processes(instance), time.time()
        self.counts.append(len(pids))
        for pid in pids.values():
            seen = cpu_and_rss(pid)
            if seen is None:
                continue
            self.rss.append(seen[1])
            if pid in self._last:
                when, cpu = self._last[pid]
                self.cpu_rates.append((seen[0] - cpu) / max(now - when, 1e-6))
            self._last[pid] = (now, seen[0])

    def summary(self) -> dict[str, Any]:
        return {
            "runs_alive_avg": round(sum(self.counts) / len(self.counts), 2) if self.counts else 0,
            "run_rss_mib_max": round(max(self.rss, default=0) / 2**20, 1),
            "run_rss_mib_p50": round((median([float(r) for r in self.rss]) or 0) / 2**20, 1),
            "run_cpu_pct_p50": round((median(self.cpu_rates) or 0) * 100, 2),
        }


def measure_idle_gaps(
    target: Target, instance: Any, datasets: list[str], gaps: list[float]
) -> dict[str, Any]:
    """Per gap: idle for it (sampling the runs' cost), then a burst of one row per dataset until visible."""
    cost, bursts = IdleCost(), []
    for gap in gaps:
        idle_until = time.time() + gap
        while time.time() < idle_until:
            cost.sample(instance)
            time.sleep(min(10.0, max(0.0, idle_until - time.time())))
        before = time.time()
        appended: dict[tuple[str, int], float] = {}
        append_at_random_moments(target, datasets, [0.0] * len(datasets), before, appended)
        seen: dict[tuple[str, int], float] = {}
        deadline = time.time() + 300
        while len(seen) < len(appended) and time.time() < deadline:
            mark_visible(target, datasets, appended, seen)
            time.sleep(0.1)
        lags = [seen[row] - appended[row] for row in seen]
        bursts.append(
            {
                "gap_s": gap,
                "rows": len(appended),
                "visible": len(seen),
                "lag_p50_s": round(percentile(lags, 0.5), 2) if lags else None,
                "lag_max_s": round(max(lags), 2) if lags else None,
                "flush_runs_started": len(
                    [run for run in flush_runs(instance, before) if run.created >= before]
                ),
            }
        )
    return {"idle_gaps": bursts, "idle_cost": cost.summary()}


def main(args: Any) -> dict[str, Any]:
    rng = random.Random(args.seed)
    if args.quick:
        args.daemon_rows, args.daemon_seconds = 24, 30.0
    gaps = idle_gaps(args)
    result: dict[str, Any] = {"bench": "wal_daemon", "load_avg_start": load_average()}
    with contextlib.contextmanager(start_dev)() as dev:
        from runstate.config import Settings

        settings = Settings.from_env(dev.env)
        shards = settings.wal_flush_shards
        result["flush_mode"] = settings.wal_flush_mode
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
        if settings.wal_flush_mode == "on-demand":  # an always-on run never ends on its own
            wait_for_flush_runs(instance, time.time() + 300)  # a lingering run ends after its idle time
        runs = flush_runs(instance, start - 60)
        idle = measure_idle_gaps(target, instance, datasets, gaps) if gaps else {}
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
            **idle,
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
