"""Event store benchmark: prints ONE JSON line of figures, each beside its in-run baseline.

    .venv/bin/python bench/eventstore.py [--batches 200] [--single 1000] [--writers 8 --per-writer 250]
                                         [--replay-events 100000] [--sf-batches 10]

- single_appends_per_s: `append()` one event at a time (one transaction each), one run.
- batched_events_per_s: `append_batch()` of 100 events (validation, idempotency check, run_seq,
  inline state snapshot every 100 events included).
- raw_insert_rows_per_s: the limit: psycopg `executemany` INSERTs of the same rows (pre-encoded) into
  a bare table with the same columns (no keys, no indexes), one transaction per 100 rows. Batched and
  raw are measured in alternating rounds so machine load hits both alike.
- concurrent8_events_per_s: 8 threads, each `append()`ing single events to its own run.
- resume_ms_with_snapshot / resume_ms_full_replay: a run of --replay-events events; `resume()` (latest
  state snapshot + the events after it, folded) against fetching every event and folding from empty.
  Medians of --repeats.
- snowflake_batched_events_per_s: `append_batch()` of 100 on fakesnow's server via the real connector.

It creates and drops its own Postgres database (and its own in-process fakesnow server).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import statistics
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import create_database, drop_database, timed_threads  # noqa: E402  (bench/ is the script's folder)

from runstate.eventstore import (  # noqa: E402
    NewEvent,
    PostgresEventStore,
    RunSnapshot,
    SnowflakeEventStore,
    fold,
    validate_event,
)

BATCH = 100
SCHEMA = "bench"
RAW_COLUMNS = (
    "run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version, event_type,"
    " event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at, adapter_version, engine_run_ref"
)
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def make_events(run_id: str, count: int, start: int = 0) -> list[NewEvent]:
    """Realistic step events with distinct idempotency keys (the step id varies)."""
    events = []
    for i in range(start, start + count):
        kind = ("StepStarted", "StepCompleted")[i % 2]
        events.append(
            NewEvent(
                run_id=run_id,
                event_type="RunStarted" if i == 0 else kind,
                emitted_at=T0 + timedelta(milliseconds=i),
                # 50 steps, re-attempted every 100 events: a long run's state stays bounded, keys stay distinct.
                step_id=None if i == 0 else f"step-{(i // 2) % 50}",
                logical_attempt_id=str(i // 100),
                data={"i": i, "rows": i * 7, "host": "worker-3", "tags": ["bench", "eventstore"]},
            )
        )
    return events


def raw_rows(events: list[NewEvent], first_seq: int) -> list[tuple]:
    rows = []
    for offset, event in enumerate(events):
        v = validate_event(event)
        rows.append(
            (
                v.run_id, first_seq + offset, v.event_id, v.step_id, v.engine_attempt_id, v.logical_attempt_id,
                v.plan_version, v.event_type, Jsonb(json.loads(v.data_json)) if v.data_json else None,
                v.idempotency_key, v.caused_by_signal_id, v.parent_event_id, v.emitted_at, v.adapter_version, None,
            )
        )
    return rows


def timed(work: Callable[[], Any]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def bench_single(store: PostgresEventStore, count: int) -> float:
    events = make_events("single", count)
    seconds = timed(lambda: [store.append(event) for event in events])
    return count / seconds


def bench_batched_vs_raw(store: PostgresEventStore, dsn: str, batches: int, rounds: int) -> tuple[float, float]:
    """Alternate rounds of store batches and raw batches of the same rows; returns (batched/s, raw/s)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {SCHEMA}.raw_events (LIKE {SCHEMA}.run_events INCLUDING DEFAULTS)")  # no keys, no indexes
    runs = 20
    plan = []  # (run_id, events, raw rows) per batch, prepared up front: raw gets pre-encoded rows
    for b in range(batches):
        run_id = f"batched-{b % runs}"
        start = (b // runs) * BATCH
        events = make_events(run_id, BATCH, start)
        plan.append((run_id, events, raw_rows(events, start + 1)))
    store_seconds = raw_seconds = 0.0
    per_round = max(1, batches // rounds)
    with psycopg.connect(dsn) as conn:
        insert = f"INSERT INTO {SCHEMA}.raw_events ({RAW_COLUMNS}) VALUES ({', '.join(['%s'] * 15)})"
        for first in range(0, batches, per_round):
            chunk = plan[first : first + per_round]
            store_seconds += timed(lambda: [store.append_batch(run_id, events) for run_id, events, _ in chunk])

            def raw() -> None:
                for _, _, rows in chunk:
                    with conn.transaction(), conn.cursor() as cur:
                        cur.executemany(insert, rows)

            raw_seconds += timed(raw)
    total = batches * BATCH
    return total / store_seconds, total / raw_seconds


def bench_concurrent(store: PostgresEventStore, writers: int, per_writer: int) -> float:
    plans = [make_events(f"concurrent-{w}", per_writer) for w in range(writers)]
    errors: list[BaseException] = []

    def writer(index: int, start: threading.Barrier) -> None:
        start.wait()
        try:
            for event in plans[index]:
                store.append(event)
        except BaseException as exc:  # surfaced below: a bench must not hide a failed writer
            errors.append(exc)

    seconds = timed_threads(writers, writer)
    if errors:
        raise RuntimeError(f"concurrent writer failed: {errors[0]!r}")
    return writers * per_writer / seconds


def full_replay(store: PostgresEventStore, run_id: str, page: int) -> RunSnapshot:
    """No snapshot: fetch every event (watermark pages) and fold from empty."""
    snapshot, after = RunSnapshot.empty(run_id), 0
    while True:
        events = store.fetch(run_id, after_seq=after, limit=page)
        if not events:
            return snapshot
        snapshot = fold(snapshot, events)
        after = events[-1].run_seq


def bench_resume(store: PostgresEventStore, events_total: int, repeats: int) -> tuple[float, float, int]:
    run_id = "replay"
    load_batch = 1000
    for start in range(0, events_total, load_batch):
        store.append_batch(run_id, make_events(run_id, min(load_batch, events_total - start), start))
    with_snapshot, replay = [], []
    for _ in range(repeats):
        point_holder: list = []
        with_snapshot.append(timed(lambda: point_holder.append(store.resume(run_id).run_snapshot(run_id))))
        replayed_holder: list = []
        replay.append(timed(lambda: replayed_holder.append(full_replay(store, run_id, 10_000))))
        if not point_holder[0].same_state(replayed_holder[0]):
            raise RuntimeError("resume from the snapshot and the full replay disagree")
    snapshot_seq = store.resume(run_id).snapshot_seq
    return statistics.median(with_snapshot) * 1000, statistics.median(replay) * 1000, snapshot_seq


def bench_snowflake(batches: int) -> float:
    import fakesnow
    import snowflake.connector

    with fakesnow.server() as kwargs:
        logging.getLogger("uvicorn.access").setLevel(logging.WARNING)  # one line per request otherwise
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
        kwargs = {**kwargs, "database": "RUNSTATE_BENCH"}
        with snowflake.connector.connect(**kwargs) as conn:
            conn.cursor().execute("CREATE DATABASE IF NOT EXISTS RUNSTATE_BENCH")
        store = SnowflakeEventStore(connect_kwargs=kwargs, schema="BENCH")
        try:
            store.ensure_schema()
            plan = [make_events(f"sf-{b % 5}", BATCH, (b // 5) * BATCH) for b in range(batches)]
            seconds = timed(lambda: [store.append_batch(events[0].run_id, events) for events in plan])
        finally:
            store.close()
    return batches * BATCH / seconds


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` drops the bench database
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--single", type=int, default=1000, help="events appended one at a time")
    parser.add_argument("--batches", type=int, default=200, help="batches of 100 (store and raw each)")
    parser.add_argument("--rounds", type=int, default=4, help="alternating store/raw rounds")
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--per-writer", type=int, default=250)
    parser.add_argument("--replay-events", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2, help="resume timings (median)")
    parser.add_argument("--sf-batches", type=int, default=10, help="batches of 100 on fakesnow (0: skip)")
    args = parser.parse_args()

    name, dsn = create_database(args.admin_url)
    figures: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        store = PostgresEventStore(dsn, schema=SCHEMA, snapshot_interval=100, pool_size=max(8, args.writers))
        store.ensure_schema()
        log("single appends ...")
        figures["single_appends_per_s"] = round(bench_single(store, args.single), 1)
        log("batched vs raw ...")
        batched, raw = bench_batched_vs_raw(store, dsn, args.batches, args.rounds)
        figures["batched_events_per_s"] = round(batched, 1)
        figures["raw_insert_rows_per_s"] = round(raw, 1)
        log("concurrent writers ...")
        figures[f"concurrent{args.writers}_events_per_s"] = round(bench_concurrent(store, args.writers, args.per_writer), 1)
        log(f"resume on a {args.replay_events}-event run ...")
        with_snapshot, replay, snapshot_seq = bench_resume(store, args.replay_events, args.repeats)
        figures["resume_ms_with_snapshot"] = round(with_snapshot, 2)
        figures["resume_ms_full_replay"] = round(replay, 2)
        figures["resume_snapshot_seq"] = snapshot_seq
        store.close()
        if args.sf_batches:
            log("snowflake (fakesnow) batches ...")
            figures["snowflake_batched_events_per_s"] = round(bench_snowflake(args.sf_batches), 1)
    finally:
        drop_database(args.admin_url, name)
    batched_ratio = figures["batched_events_per_s"] / figures["raw_insert_rows_per_s"]
    resume_speedup = figures["resume_ms_full_replay"] / max(figures["resume_ms_with_snapshot"], 1e-6)
    figures.update(
        {
            "batched_vs_raw": round(batched_ratio, 3),
            "resume_speedup": round(resume_speedup, 1),
            "target_batched_ge_half_raw": batched_ratio >= 0.5,
            "target_resume_20x": resume_speedup >= 20,
            "params": {
                "batch": BATCH,
                "batches": args.batches,
                "single": args.single,
                "writers": args.writers,
                "per_writer": args.per_writer,
                "replay_events": args.replay_events,
                "sf_batches": args.sf_batches,
            },
            "seconds": round(time.perf_counter() - started, 1),
        }
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
