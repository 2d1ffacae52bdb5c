"""Fan-out through the real daemon: one row appended to each of N datasets at once, until readers see it.

Starts a `runstate dev` of its own (webserver + daemon + services, scratch databases), then for each N
appends one row to each of N new datasets from a few threads and polls until each row is visible
(LastAppliedSeq advanced: right after the manifest commit; one Query per poll; every manifest is checked
at the end). Prints ONE JSON line with, per N: first_visible_s, p50_visible_s, all_visible_s
(None if not all visible before --timeout-s), flush_runs, the most flush runs requested in any 30 s
window (floor: <= 2 x shards), and where the time goes, as medians over the flush runs: sensor_delay_s
(append -> run created), queue_wait_s, run_start_s (launch -> worker running), flush_s (the op).
The baseline, measured in the same run through the same daemon, is N = 1.

Floors on the 2-core machine: N = 100 all visible within 90 s; N = 1000 within 300 s.
Usage: python bench/wal_fanout.py [--sizes 10,100,1000] [--shards S]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("DAGSTER_TELEMETRY_ENABLED", "false")

from wal_devserver import DevServer, flush_runs, load_average, median, percentile, start_dev  # noqa: E402

from runstate.wal import BlobStore, Change, WalProducer, WalTable  # noqa: E402
from runstate.wal.clients import aws_client  # noqa: E402

TIMER_S = 30.0
THREADS = 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10,100,1000", help="comma-separated N (default 10,100,1000)")
    parser.add_argument(
        "--shards", type=int, default=None, help="RUNSTATE_WAL_FLUSH_SHARDS (default: the setting's)"
    )
    parser.add_argument("--timeout-s", type=float, default=600.0, help="give up on a phase after this long")
    return parser.parse_args(argv)


class Target:
    """The dev server's WAL table and bucket, through clients of the bench's own."""

    def __init__(self, dev: DevServer) -> None:
        endpoint = dev.env["RUNSTATE_AWS_ENDPOINT_URL"]
        self.producer = WalProducer(
            aws_client("dynamodb", endpoint_url=endpoint), dev.env.get("RUNSTATE_WAL_TABLE", "runstate_wal")
        )
        self.table = WalTable(self.producer.dynamodb, self.producer.table)
        self.blobs = BlobStore(
            aws_client("s3", endpoint_url=endpoint),
            dev.env.get("RUNSTATE_BLOB_BUCKET", "runstate-blobs"),
            dev.env.get("RUNSTATE_BLOB_PREFIX", "datasets/"),
        )

    def applied(self) -> dict[str, int]:
        """Every dataset's LastAppliedSeq in one Query. A flush advances it right after the manifest commit
        and the row marks, so a row counts as visible a few milliseconds late, never early; polling one
        manifest per dataset instead would load the server the flushes use with 2,000 GETs a second."""
        return {dataset_id: meta.last_applied_seq for dataset_id, meta in self.table.metas().items()}


def append_all(target: Target, datasets: list[str]) -> dict[str, float]:
    """One row per dataset, from a few threads; returns when each append returned (epoch seconds)."""

    def append(dataset_id: str) -> tuple[str, float]:
        target.producer.append(dataset_id, [Change.upsert("k", {"dataset": dataset_id})])
        return dataset_id, time.time()

    with ThreadPoolExecutor(THREADS) as pool:
        return dict(pool.map(append, datasets))


def wait_visible(target: Target, datasets: list[str], deadline: float) -> dict[str, float]:
    """Poll the datasets' applied seqs until every dataset's row is visible or the deadline passes."""
    seen: dict[str, float] = {}
    while len(seen) < len(datasets) and time.time() < deadline:
        applied, now = target.applied(), time.time()
        for dataset_id in datasets:
            if dataset_id not in seen and applied.get(dataset_id, 0) >= 1:
                seen[dataset_id] = now
        time.sleep(0.5)
    # The readers' view, checked once at the end: every dataset counted visible really is.
    if any(target.blobs.read_manifest(ds).version < 1 for ds in seen):
        raise SystemExit("a dataset counted visible has no row in its manifest")
    return seen


def wait_runs_finished(instance: Any, timeout: float = 180.0) -> None:
    """Let the phase's runs end, so the next phase's figures are its own."""
    import dagster as dg

    live = [
        dg.DagsterRunStatus.QUEUED,
        dg.DagsterRunStatus.NOT_STARTED,
        dg.DagsterRunStatus.STARTING,
        dg.DagsterRunStatus.STARTED,
    ]
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not instance.get_runs(filters=dg.RunsFilter(job_name="flush_wal", statuses=live), limit=1):
            return
        time.sleep(1.0)


def most_runs_in_a_timer_period(created: list[float]) -> int:
    created = sorted(created)
    return max(
        (sum(1 for other in created if start <= other < start + TIMER_S) for start in created), default=0
    )


def phase(dev: DevServer, target: Target, instance: Any, n: int, timeout_s: float) -> dict[str, Any]:
    datasets = [f"fan{n}-{i:04d}-{int(time.time())}" for i in range(n)]
    started = time.time()
    appended = append_all(target, datasets)
    seen = wait_visible(target, datasets, started + timeout_s)
    wait_runs_finished(instance)
    lags = sorted(seen[ds] - appended[ds] for ds in seen)
    runs = flush_runs(instance, started - 1)
    return {
        "n": n,
        "visible": len(seen),
        "append_s": round(max(appended.values()) - started, 2),
        "first_visible_s": round(lags[0], 2) if lags else None,
        "p50_visible_s": round(percentile(lags, 0.5), 2) if lags else None,
        "all_visible_s": round(lags[-1], 2) if len(seen) == n else None,
        "flush_runs": len(runs),
        "max_runs_per_30s": most_runs_in_a_timer_period([run.created for run in runs]),
        "sensor_delay_s": median([run.created - started for run in runs]),
        "queue_wait_s": median([run.queue_wait_s for run in runs]),
        "run_start_s": median([run.run_start_s for run in runs]),
        "flush_s": median([run.flush_s for run in runs]),
        "load_avg": load_average(),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    result: dict[str, Any] = {"bench": "wal_fanout", "timer_s": TIMER_S, "load_avg_start": load_average()}
    with contextlib.contextmanager(start_dev)(shards=args.shards) as dev:
        from runstate.config import Settings

        shards = Settings.from_env(dev.env).wal_flush_shards
        target, instance = Target(dev), dev.instance()
        # The daemon's first sensor tick and run launch pay one-off costs: warm them up, unmeasured.
        phase(dev, target, instance, 1, args.timeout_s)
        result["baseline_n1"] = phase(dev, target, instance, 1, args.timeout_s)
        for n in sizes:
            result[f"n{n}"] = phase(dev, target, instance, n, args.timeout_s)
    result["shards"] = shards
    floors = {100: 90.0, 1000: 300.0}
    result["floors_met"] = all(
        (result[f"n{n}"]["all_visible_s"] or float("inf")) <= floors.get(n, float("inf"))
        and result[f"n{n}"]["max_runs_per_30s"] <= 2 * shards
        for n in sizes
    )
    print(json.dumps(result, sort_keys=True), flush=True)
    return result


if __name__ == "__main__":
    main()
