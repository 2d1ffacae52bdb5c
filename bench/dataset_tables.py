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

Usage: python bench/dataset_tables.py [--changes-500k N --keys-500k N --changes-2m N --keys-2m N]
(smaller numbers for a quick look)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
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
    s3: Any, location: Any, dataset_id: str, rows: list[tuple[int, list[Any]]], offset: int = 0
) -> int:
    """The rows as deltas of ROWS_PER_DELTA WAL rows each, seqs shifted by `offset`; returns the version."""
    from runstate.wal.dataset_tables.source import publish_delta

    version = 0
    for start in range(0, len(rows), ROWS_PER_DELTA):
        chunk = [(seq + offset, batch) for seq, batch in rows[start : start + ROWS_PER_DELTA]]
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

    return BlobLocation(bucket=BUCKET, prefix=PREFIX, endpoint_url=args.endpoint)


def _session(args: argparse.Namespace) -> Any:
    from runstate.spark import SparkSettings, build_session

    spark = build_session(
        SparkSettings(
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


ROLES = {"generate": role_generate, "rebuild": role_rebuild, "merge": role_merge}


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
    parser.add_argument("--role", choices=sorted(ROLES), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--pg-url", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--warehouse", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dataset", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> dict[str, Any]:
    import boto3

    from runstate.services.moto_server import SerializedMotoServer

    server = SerializedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    name, args.pg_url = create_database(ADMIN_URL)
    try:
        with tempfile.TemporaryDirectory(prefix="runstate-bench-warehouse-") as warehouse:
            args.endpoint, args.warehouse = f"http://{host}:{port}", warehouse
            boto3.client("s3", endpoint_url=args.endpoint).create_bucket(Bucket=BUCKET)
            run_role("generate", args)
            merged = run_role("merge", args)
            small = run_role("rebuild", args, dataset="r500k")
            large = run_role("rebuild", args, dataset="r2m")
    finally:
        drop_database(ADMIN_URL, name)
        server.stop()
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
    }


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.role:
        print(json.dumps(ROLES[arguments.role](arguments)))
    else:
        print(json.dumps(main(arguments)))
