"""Benchmark of the dataset WAL shell against moto's server (a serialised moto server of its own).

Prints ONE JSON line:
- flush_rows_per_s: rows applied per second by one flush_wal run (the Dagster job the sensor launches,
  executed in-process) over `--rows` Pending rows of one dataset (max_batch_size = rows);
- raw_update_rows_per_s: the baseline, raw boto3 conditional UpdateItems of the same rows, one after
  another, same endpoint, same run (raw_parallel_update_rows_per_s: the same with the flush's threads);
Target: flush >= 0.5 x raw. Scale down with e.g. `--rows 1000`.

The lag from append to visible is a property of the deployment (always-on flush runs started by the
daemon's sensor), so it is measured through one: `--daemon` starts a `runstate dev` of its own
(bench/wal_daemon.py).
"""

from __future__ import annotations

import argparse
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

import boto3  # noqa: E402
import dagster as dg  # noqa: E402
from botocore.config import Config  # noqa: E402
from wal_daemon import add_arguments  # noqa: E402
from wal_daemon import main as daemon_main  # noqa: E402

from runstate.defs.wal import build_defs  # noqa: E402
from runstate.defs.wal.resources import WalResource  # noqa: E402
from runstate.services.moto_server import SerializedMotoServer  # noqa: E402
from runstate.wal import Change, WalProducer, ensure_blob_bucket, ensure_wal_table  # noqa: E402
from runstate.wal import layout as t  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows", type=int, default=5000, help="WAL rows in the measured flush (default 5000)"
    )
    parser.add_argument(
        "--seed-threads",
        type=int,
        default=1,
        help="appending threads while seeding (moto does not serialise concurrent conditional puts: keep 1)",
    )
    add_arguments(parser)  # --daemon and its options
    return parser.parse_args(argv)


class World:
    def __init__(self, endpoint: str) -> None:
        config = Config(max_pool_connections=64, retries={"mode": "standard"})
        self.endpoint = endpoint
        self.dynamodb = boto3.client(
            "dynamodb", endpoint_url=endpoint, region_name="us-east-1", config=config
        )
        self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=config)
        self.table, self.bucket, self.prefix = "bench_wal", "bench-blobs", "datasets/"
        ensure_wal_table(self.dynamodb, self.table)
        ensure_blob_bucket(self.s3, self.bucket)

    def resource(self, max_batch_size: int) -> WalResource:
        # One flush run over a planned batch: no run interval, no linger after it, no held lease.
        return WalResource(
            endpoint_url=self.endpoint,
            region="us-east-1",
            table=self.table,
            bucket=self.bucket,
            prefix=self.prefix,
            max_batch_size=max_batch_size,
            min_run_interval_s=0,
            flush_linger_s=0,
            flush_always_on=False,
        )


def seed(world: World, dataset_id: str, rows: int, threads: int) -> list[int]:
    """Append `rows` single-change rows to one dataset from a few threads (the producer serialises seqs)."""
    producer = WalProducer(world.dynamodb, world.table)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        seqs = list(
            pool.map(lambda i: producer.append(dataset_id, [Change.upsert(f"k{i}", {"i": i})]), range(rows))
        )
    # Concurrent appends must get distinct seqs: a repeated seq would be a lost change.
    repeated = sorted({seq for seq in seqs if seqs.count(seq) > 1}) if len(set(seqs)) != len(seqs) else []
    if repeated:
        raise SystemExit(
            f"seeding: {len(seqs)} appends returned {len(set(seqs))} distinct seqs; repeated: {repeated[:10]}"
        )
    return sorted(seqs)


def measure_flush(world: World, dataset_id: str, seqs: list[int]) -> tuple[float, int]:
    """One flush_wal run over every seq, as the sensor would request it; returns (seconds, rows applied)."""
    defs = build_defs(wal=world.resource(max_batch_size=len(seqs)))
    job = defs.resolve_job_def("flush_wal")
    batches = [{"dataset_id": dataset_id, "seqs": seqs}]
    run_config = {"ops": {"flush_wal_shard": {"config": {"shard": 0, "batches": batches}}}}
    started = time.perf_counter()
    result = job.execute_in_process(run_config=run_config, instance=dg.DagsterInstance.ephemeral())
    elapsed = time.perf_counter() - started
    [materialization] = result.asset_materializations_for_node("flush_wal_shard")
    return elapsed, int(materialization.metadata["applied"].value)


def raw_update(world: World, dataset_id: str, seq: int, status: str) -> None:
    """The same write the flush does per row (StatusIdx, BlobKey, AppliedAt under a StatusIdx condition)."""
    world.dynamodb.update_item(
        TableName=world.table,
        Key={t.DATASET_ID: {"S": dataset_id}, t.SEQ_NO: {"N": str(seq)}},
        UpdateExpression="SET #status = :status, #blob = :blob, #at = :at",
        ConditionExpression="#status = :status",
        ExpressionAttributeNames={"#status": t.STATUS_IDX, "#blob": t.BLOB_KEY, "#at": t.APPLIED_AT},
        ExpressionAttributeValues={
            ":status": {"S": status},
            ":blob": {"S": "bench"},
            ":at": {"N": str(int(time.time()))},
        },
    )


def measure_raw(world: World, dataset_id: str, seqs: list[int], threads: int) -> float:
    """Raw conditional UpdateItems of the (already Applied) rows: one after another, or from a pool."""
    status = world.dynamodb.get_item(
        TableName=world.table, Key={t.DATASET_ID: {"S": dataset_id}, t.SEQ_NO: {"N": str(seqs[0])}}
    )["Item"][t.STATUS_IDX]["S"]
    started = time.perf_counter()
    if threads == 1:
        for seq in seqs:
            raw_update(world, dataset_id, seq, status)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(lambda seq: raw_update(world, dataset_id, seq, status), seqs))
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.daemon:
        result = daemon_main(args)
        print(json.dumps(result, sort_keys=True), flush=True)
        return result
    server = SerializedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        world = World(f"http://{host}:{port}")
        seed_started = time.perf_counter()
        seqs = seed(world, "flushbench", args.rows, args.seed_threads)
        seed_s = time.perf_counter() - seed_started
        flush_s, applied = measure_flush(world, "flushbench", seqs)
        if applied != args.rows:
            raise SystemExit(f"flush applied {applied} rows, expected {args.rows}")
        raw_s = measure_raw(world, "flushbench", seqs, threads=1)
        raw_parallel_s = measure_raw(world, "flushbench", seqs, threads=16)
    finally:
        server.stop()
    flush_rate, raw_rate = args.rows / flush_s, args.rows / raw_s
    result = {
        "bench": "wal",
        "rows": args.rows,
        "flush_rows_per_s": round(flush_rate, 1),
        "raw_update_rows_per_s": round(raw_rate, 1),
        "flush_vs_raw": round(flush_rate / raw_rate, 2),
        "raw_parallel_update_rows_per_s": round(args.rows / raw_parallel_s, 1),
        "seed_append_rows_per_s": round(args.rows / seed_s, 1),
        "targets_met": flush_rate >= 0.5 * raw_rate,
    }
    print(json.dumps(result, sort_keys=True), flush=True)
    return result


if __name__ == "__main__":
    main()
