"""Benchmark of the dataset tables: merge and rebuild on Spark local[2], blobs on moto's server.

Prints ONE JSON line:
- merge_rows_per_s: a backlog of 50,000 changes (50 deltas) over 10,000 keys merged into a table that
  holds those keys, by `merge_dataset` (blobs read and checksummed in Spark tasks, last change per key,
  MERGE where newer); beside it raw_merge_rows_per_s: the same 50,000 change rows given to Spark as a
  local DataFrame, the same last-change-per-key and the same MERGE, in the same session, into a copy
  of the same table. Floor: merge >= 0.5 x raw.
- rebuild_rows_per_s (2,000,000 changes over 500,000 keys) and rebuild_rows_per_s_500k (500,000 over
  100,000), and the peak RSS of the Python process holding the SparkSession for each rebuild,
  rebuild_rss_mb_500k and rebuild_rss_mb_2m (each rebuild runs in a process of its own, with
  spark.driver.memory=1g). The rows never pass through that process, so the two must be within 20%.
The blobs are written with the WAL's own encoder and manifest put (`publish_delta`), in a separate
process: millions of changes through moto's DynamoDB would take hours.

With --cluster (a few minutes) it measures instead the merge of many datasets (a merge shard's run:
--fanout-datasets datasets of --fanout-changes changes each, merged one after the other in one session)
on local[2] and on standalone clusters it starts from the installed pyspark, with 2 workers and then
1 (one executor per worker), and prints the cost per change row of each beside the others, and
scaling_2w_over_1w (on 2 cores expect no speed-up: the figure that matters is that it stays near 1).
Every table is checked against the blob reader. --master spark://... uses that cluster instead of
starting any (no scaling figure then). Both modes record the load average at start and end; "quiet"
is false when the 1-minute load was above 1.0 at the start.

Usage: python bench/dataset_tables.py [--changes-500k N --keys-500k N --changes-2m N --keys-2m N]
       python bench/dataset_tables.py --cluster [--master spark://HOST:PORT] [--fanout-datasets N]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from bench.common import create_database, drop_database  # noqa: E402

ADMIN_URL = os.environ.get("RUNSTATE_BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
BUCKET, PREFIX = "bench-blobs", "datasets/"
CHANGES_PER_ROW, ROWS_PER_DELTA = 10, 1000  # a delta: 1,000 WAL rows of 10 changes
FANOUT_ROWS_PER_DELTA = 100  # the fan-out datasets: deltas of 1,000 changes, as a 30 s flush makes them


def changes(count: int, keys: int, seed: int) -> list[tuple[int, list[Any]]]:
    """(seq, changes) WAL rows: `count` changes over `keys` keys, one in ten a delete."""
    from runstate.wal.changes import Change

    rng = random.Random(seed)
    rows, seq = [], 0
    for start in range(0, count, CHANGES_PER_ROW):
        seq += 1
        batch = []
        for n in range(start, min(start + CHANGES_PER_ROW, count)):
            key = f"k{rng.randrange(keys)}"
            value = {"n": n, "w": rng.random()}
            batch.append(Change.delete(key) if rng.random() < 0.1 else Change.upsert(key, value))
        rows.append((seq, batch))
    return rows


def publish(
    s3: Any,
    location: Any,
    dataset_id: str,
    rows: list[tuple[int, list[Any]]],
    offset: int = 0,
    per_delta: int = ROWS_PER_DELTA,
) -> int:
    """The rows as deltas of `per_delta` WAL rows each, seqs shifted by `offset`; returns the version."""
    from runstate.wal.dataset_tables.source import publish_delta

    version = 0
    for start in range(0, len(rows), per_delta):
        chunk = [(seq + offset, batch) for seq, batch in rows[start : start + per_delta]]
        version = publish_delta(s3, location, dataset_id, chunk)
    return version


# --- the roles, each run in a process of its own -------------------------------------------------------


def role_generate(args: argparse.Namespace) -> dict[str, Any]:
    location = _location(args)
    s3 = location.client()
    versions = {}
    sizes = (("r500k", args.changes_500k, args.keys_500k), ("r2m", args.changes_2m, args.keys_2m))
    for dataset_id, count, keys in sizes:
        versions[dataset_id] = publish(s3, location, dataset_id, changes(count, keys, seed=count))
    return versions


def fanout_ids(args: argparse.Namespace) -> list[str]:
    return [f"fan{n}" for n in range(args.fanout_datasets)]


def role_generate_fanout(args: argparse.Namespace) -> dict[str, Any]:
    location = _location(args)
    s3 = location.client()
    for n, dataset_id in enumerate(["fanwarm", *fanout_ids(args)]):
        rows = changes(args.fanout_changes, args.fanout_changes // 4, seed=n)
        publish(s3, location, dataset_id, rows, per_delta=FANOUT_ROWS_PER_DELTA)
    return {}


def role_fanout(args: argparse.Namespace) -> dict[str, Any]:
    """Merge every fan-out dataset into a fresh table, one after the other, as a merge shard's run does."""
    from runstate.wal import DatasetReader
    from runstate.wal.dataset_tables import merge_dataset, read_table, table_ident

    spark, location = _session(args), _location(args)
    _wait_for_executors(spark, args.executors)
    ids = fanout_ids(args)
    for dataset_id in ["fanwarm", *ids]:
        spark.sql(f"DROP TABLE IF EXISTS {table_ident(dataset_id)} PURGE")
    merge_dataset(spark, location, "fanwarm")  # JIT, catalog and Python workers warm; not timed
    started = time.perf_counter()
    for dataset_id in ids:
        merge_dataset(spark, location, dataset_id)
    seconds = time.perf_counter() - started
    s3 = location.client()
    verified = all(read_table(spark, d) == DatasetReader(s3, BUCKET, PREFIX, d).read() for d in ids)
    return {"seconds": seconds, "executors": _executors(spark), "verified": verified}


def _executors(spark: Any) -> int:
    """Executors besides the driver (0 in local mode, where tasks run in the driver's JVM)."""
    return spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1


def _wait_for_executors(spark: Any, wanted: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while _executors(spark) < wanted:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{wanted} executor(s) did not register within {timeout:.0f} s")
        time.sleep(0.5)


def role_rebuild(args: argparse.Namespace) -> dict[str, Any]:
    from runstate.wal.dataset_tables import rebuild_dataset

    spark = _session(args)
    started = time.perf_counter()
    result = rebuild_dataset(spark, _location(args), args.dataset)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "version": result.version, "rss_mb": _peak_rss_mb()}


def role_merge(args: argparse.Namespace) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from runstate.wal.changes import canonical_json
    from runstate.wal.dataset_tables import merge_dataset, table_ident
    from runstate.wal.dataset_tables.merge import merge_statement
    from runstate.wal.dataset_tables.source import MergePlan

    spark, location = _session(args), _location(args)
    s3, dataset_id, keys, backlog = location.client(), "m50k", 10_000, 50_000
    initial = [(1, [_upsert(f"k{n}", {"n": n}) for n in range(keys)])]
    publish(s3, location, dataset_id, initial)
    merge_dataset(spark, location, dataset_id)  # the table holds the 10,000 keys (and the JVM is warm)
    ident, raw = table_ident(dataset_id), "lake.bench.raw_m50k"
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.bench")
    spark.sql(f"DROP TABLE IF EXISTS {raw}")
    spark.sql(
        f"CREATE TABLE {raw} USING iceberg TBLPROPERTIES ('format-version'='2', "
        f"'write.merge.mode'='merge-on-read') AS SELECT * FROM {ident}"
    )

    rows = changes(backlog, keys, seed=50)
    version = publish(s3, location, dataset_id, rows, offset=1)
    started = time.perf_counter()
    merge_dataset(spark, location, dataset_id)
    merge_seconds = time.perf_counter() - started

    # The rows exactly as the blob readers yield them (keys and values as canonical JSON text).
    local = [
        (
            canonical_json(c.key),
            None if c.op == "delete" else canonical_json(c.value),
            seq + 1,
            pos,
            c.op == "delete",
        )
        for seq, batch in rows
        for pos, c in enumerate(batch)
    ]
    frame = spark.createDataFrame(local, "key STRING, value STRING, wal_seq BIGINT, pos INT, deleted BOOLEAN")
    started = time.perf_counter()
    last = frame.groupBy("key").agg(F.max(F.struct("wal_seq", "pos", "value", "deleted")).alias("c"))
    last.select("key", "c.value", "c.wal_seq", "c.deleted").createOrReplaceTempView("raw_incoming")
    spark.sql(merge_statement(raw, "raw_incoming", MergePlan(dataset_id, 1, version, (), False)))
    raw_seconds = time.perf_counter() - started
    return {"merge_seconds": merge_seconds, "raw_seconds": raw_seconds, "changes": backlog}


def _upsert(key: str, value: Any) -> Any:
    from runstate.wal.changes import Change

    return Change.upsert(key, value)


def _location(args: argparse.Namespace) -> Any:
    from runstate.wal.dataset_tables import BlobLocation

    # Explicit keys: a cluster's executors do not share this process's environment.
    return BlobLocation(
        bucket=BUCKET,
        prefix=PREFIX,
        endpoint_url=args.endpoint,
        access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
    )


def _session(args: argparse.Namespace) -> Any:
    from runstate.spark import SparkSettings, build_session

    spark = build_session(
        SparkSettings(
            master=args.master or "local[2]",
            pg_url=args.pg_url,
            warehouse_dir=Path(args.warehouse),
            extra_conf={"spark.driver.memory": "1g"},
            app_name="runstate-bench",
        )
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


ROLES = {
    "generate": role_generate,
    "rebuild": role_rebuild,
    "merge": role_merge,
    "generate_fanout": role_generate_fanout,
    "fanout": role_fanout,
}


def run_role(role: str, args: argparse.Namespace, **extra: str) -> dict[str, Any]:
    argv = [
        sys.executable,
        __file__,
        "--role",
        role,
        "--endpoint",
        args.endpoint,
        "--pg-url",
        args.pg_url,
        "--warehouse",
        args.warehouse,
        "--changes-2m",
        str(args.changes_2m),
        "--keys-2m",
        str(args.keys_2m),
        "--changes-500k",
        str(args.changes_500k),
        "--keys-500k",
        str(args.keys_500k),
        "--fanout-datasets",
        str(args.fanout_datasets),
        "--fanout-changes",
        str(args.fanout_changes),
    ]
    for name, value in extra.items():
        argv += [f"--{name}", value]
    done = subprocess.run(argv, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes-500k", type=int, default=500_000)
    parser.add_argument("--keys-500k", type=int, default=100_000)
    parser.add_argument("--changes-2m", type=int, default=2_000_000)
    parser.add_argument("--keys-2m", type=int, default=500_000)
    parser.add_argument("--cluster", action="store_true", help="local[2] beside standalone clusters")
    parser.add_argument("--master", default=None, help="with --cluster: this cluster instead of our own")
    parser.add_argument("--fanout-datasets", type=int, default=20)
    parser.add_argument("--fanout-changes", type=int, default=5_000)
    parser.add_argument("--executors", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--role", choices=sorted(ROLES), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--pg-url", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--warehouse", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dataset", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


@contextmanager
def bench_world(args: argparse.Namespace) -> Iterator[Path]:
    """moto's server, a scratch database and a warehouse folder, set on `args` for the roles."""
    import boto3

    from runstate.services.moto_server import SerializedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per blob read otherwise
    server = SerializedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    name, args.pg_url = create_database(ADMIN_URL)
    try:
        with tempfile.TemporaryDirectory(prefix="runstate-bench-warehouse-") as warehouse:
            args.endpoint, args.warehouse = f"http://{host}:{port}", warehouse
            boto3.client("s3", endpoint_url=args.endpoint).create_bucket(Bucket=BUCKET)
            yield Path(warehouse)
    finally:
        drop_database(ADMIN_URL, name)
        server.stop()


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cluster_comparison(args: argparse.Namespace) -> dict[str, Any]:
    from runstate.services.spark_cluster import StandaloneCluster

    load_start, runs = load(), {}
    with bench_world(args) as folder:
        run_role("generate_fanout", args)
        runs["local[2]"] = run_role("fanout", args, master="local[2]")
        if args.master:
            runs[args.master] = run_role("fanout", args, master=args.master, executors="1")
        for workers in () if args.master else (2, 1):
            cluster = StandaloneCluster.start(workers, base_dir=folder / f"spark-{workers}")
            try:
                runs[f"standalone_{workers}w"] = run_role(
                    "fanout", args, master=cluster.url, executors=str(workers)
                )
            finally:
                cluster.stop()
    rows = args.fanout_datasets * args.fanout_changes
    per_row = {engine: round(run["seconds"] / rows * 1e6, 1) for engine, run in runs.items()}
    result = {
        "bench": "dataset_tables_cluster",
        "datasets": args.fanout_datasets,
        "changes": rows,
        "us_per_change": per_row,
        "seconds": {engine: round(run["seconds"], 2) for engine, run in runs.items()},
        "executors": {engine: run["executors"] for engine, run in runs.items()},
        "verified": all(run["verified"] for run in runs.values()),
    }
    if "standalone_1w" in per_row:
        result["scaling_2w_over_1w"] = round(per_row["standalone_2w"] / per_row["standalone_1w"], 2)
    return {**result, **load_record(load_start)}


def load_record(load_start: list[float]) -> dict[str, Any]:
    return {"load_start": load_start, "load_end": load(), "quiet": load_start[0] <= 1.0}


def main(args: argparse.Namespace) -> dict[str, Any]:
    load_start = load()
    with bench_world(args):
        run_role("generate", args)
        merged = run_role("merge", args)
        small = run_role("rebuild", args, dataset="r500k")
        large = run_role("rebuild", args, dataset="r2m")
    return {
        "bench": "dataset_tables",
        "merge_rows_per_s": round(merged["changes"] / merged["merge_seconds"]),
        "raw_merge_rows_per_s": round(merged["changes"] / merged["raw_seconds"]),
        "rebuild_rows_per_s": round(args.changes_2m / large["seconds"]),
        "rebuild_rows_per_s_500k": round(args.changes_500k / small["seconds"]),
        "rebuild_rss_mb_500k": round(small["rss_mb"], 1),
        "rebuild_rss_mb_2m": round(large["rss_mb"], 1),
        "changes": [args.changes_500k, args.changes_2m],
        "keys": [args.keys_500k, args.keys_2m],
        **load_record(load_start),
    }


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.role:
        print(json.dumps(ROLES[arguments.role](arguments)))
    elif arguments.cluster:
        print(json.dumps(cluster_comparison(arguments)))
    else:
        print(json.dumps(main(arguments)))
