"""Event store benchmark: prints ONE JSON line of figures, each beside its in-run baseline.

    .venv/bin/python bench/eventstore.py [--rounds 5] [--replay-events 100000] [--sf-batches 10]

The peer is the eventsourcing library's PostgresApplicationRecorder (the `bench` extra), on the same
server, in the same run, on the same shapes (payload about 90 bytes):
- single: 2,000 `append()`s over 200 runs (one transaction each);
- batched: 200 batches of 100 events, each batch its own run;
- concurrent8: 8 processes, each 200 batches of 10 events over its own 10 runs.
Both start from the same Python payloads: runstate validates and encodes them in `append_batch`, the
peer encodes each with its own JSONTranscoder (as its mapper does) before `insert_events`. Each side's
input objects (NewEvent; stream id, version and payload) are built before the clock starts.
The two libraries take turns round by round (so machine load hits both alike), each timed shape
after a CHECKPOINT; each figure is the median of the rounds. `vs_eventsourcing_*` = runstate /
eventsourcing. The store runs with its defaults: a state snapshot every 100 events, the feed position
and NOTIFY, the event_type index (the seed's GIN on event_data is gone since migration 009).

Also: `batched_without_6_2_indexes_per_s` (the same batches with the seed's §6.2 indexes dropped: the
event_type BTREE, and on a store from before migration 009 the event_data GIN),
`raw_insert_rows_per_s` (psycopg executemany of the same rows into a bare table: the floor of the
cost), resume on a --replay-events run with the snapshot at the tail and with it 50 events before the
tail (against a full replay), and Snowflake (fakesnow) batches.

It creates and drops its own Postgres database (and its own in-process fakesnow server). The line
carries the date and the 1-minute load average at the start and the end, and `"quiet": false` when
the load was above 1.0 at the start: quote only quiet lines.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import queue
import signal
import statistics
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import create_database, drop_database  # noqa: E402  (bench/ is the script's folder)

from runstate.eventstore import (  # noqa: E402
    NewEvent,
    PostgresEventStore,
    RunSnapshot,
    SnowflakeEventStore,
    fold,
)

SCHEMA = "bench"
QUIET_LOAD = 1.0  # the 1-minute load average above which a line is marked "quiet": false
T0 = datetime(2026, 1, 1, tzinfo=UTC)
SHAPES = {
    "single": (200, 10, 1),
    "batched": (200, 1, 100),
    "concurrent8": (10, 20, 10),
}  # runs, batches/run, size


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def payload(i: int) -> dict[str, Any]:
    return {"i": i, "rows": i * 7, "host": "worker-3", "tags": ["bench", "eventstore"]}  # ~90 bytes as JSON


def make_events(run_id: str, count: int, start: int = 0) -> list[NewEvent]:
    """Step events with distinct idempotency keys: 50 steps, re-attempted every 100 events."""
    return [
        NewEvent(
            run_id=run_id,
            event_type="RunStarted" if i == 0 else ("StepStarted", "StepCompleted")[i % 2],
            emitted_at=T0 + timedelta(milliseconds=i),
            step_id=None if i == 0 else f"step-{(i // 2) % 50}",
            logical_attempt_id=str(i // 100),
            data=payload(i),
        )
        for i in range(start, start + count)
    ]


def timed(work: Callable[[], Any]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


# -- the two writers ---------------------------------------------------------------------------


class RunstateWriter:
    def __init__(self, dsn: str, schema: str, tag: str, create: bool = True):
        self.store = PostgresEventStore(dsn, schema=schema, pool_size=1)
        if create:
            self.store.ensure_schema()
        self.tag = tag

    def plan(self, shape: str, worker: int = 0) -> list[tuple[str, list[NewEvent]]]:
        runs, per_run, size = SHAPES[shape]
        return [
            (
                f"{self.tag}-{shape}-{worker}-{r}",
                make_events(f"{self.tag}-{shape}-{worker}-{r}", size, b * size),
            )
            for b in range(per_run)
            for r in range(runs)
        ]

    def write(self, plan: list[tuple[str, list[NewEvent]]]) -> None:
        for run_id, events in plan:
            if len(events) == 1:
                self.store.append(events[0])
            else:
                self.store.append_batch(run_id, events)

    def close(self) -> None:
        self.store.close()


class EventsourcingWriter:
    def __init__(self, dsn: str, schema: str, tag: str, create: bool = True):
        from eventsourcing.persistence import JSONTranscoder, StoredEvent
        from eventsourcing.postgres import (
            PostgresApplicationRecorder,
            PostgresDatastore,
        )

        info = conninfo_to_dict(dsn)
        self.datastore = PostgresDatastore(
            dbname=info["dbname"],
            host=info.get("host", "127.0.0.1"),
            port=info.get("port", 5432),
            user=info.get("user", "postgres"),
            password=info.get("password", ""),
            schema=schema,
        )
        self.recorder = PostgresApplicationRecorder(self.datastore, events_table_name="es_events")
        self.transcoder = JSONTranscoder()
        self.stored_event = StoredEvent
        if create:  # its DDL (CREATE OR REPLACE FUNCTION ...) fails when processes race on it
            self.recorder.create_table()
        self.tag = tag

    def plan(self, shape: str, worker: int = 0) -> list[list[tuple[uuid.UUID, int, dict[str, Any]]]]:
        """The same events as runstate's plan: (stream id, version, payload), the payload still a dict."""
        runs, per_run, size = SHAPES[shape]
        ids = [uuid.uuid5(uuid.NAMESPACE_URL, f"{self.tag}-{shape}-{worker}-{r}") for r in range(runs)]
        return [
            [(ids[r], b * size + i + 1, payload(b * size + i)) for i in range(size)]
            for b in range(per_run)
            for r in range(runs)
        ]

    def write(self, plan: list[list[tuple[uuid.UUID, int, dict[str, Any]]]]) -> None:
        # Encoding the payload is part of the work, as it is for runstate (whose validation encodes it):
        # with the library's own transcoder, as its mapper does before the recorder sees the event.
        encode, stored = self.transcoder.encode, self.stored_event
        for batch in plan:
            self.recorder.insert_events([stored(i, v, "bench:Event", encode(data)) for i, v, data in batch])

    def close(self) -> None:
        self.datastore.close()


WRITERS = {"runstate": RunstateWriter, "eventsourcing": EventsourcingWriter}


def run_shape(kind: str, dsn: str, schema: str, shape: str, tag: str) -> float:
    """Events per second of one writer on one shape (in this process)."""
    writer = WRITERS[kind](dsn, schema, tag)
    try:
        plan = writer.plan(shape)
        runs, per_run, size = SHAPES[shape]
        return runs * per_run * size / timed(lambda: writer.write(plan))
    finally:
        writer.close()


def _concurrent_worker(
    kind: str, dsn: str, schema: str, tag: str, worker: int, barrier: Any, out: Any
) -> None:
    """Reports ("ok", worker, (start, end)) or ("error", worker, traceback) on `out`; a failure
    breaks the barrier so that the others stop waiting for this worker."""
    try:
        writer = WRITERS[kind](dsn, schema, tag, create=False)  # the parent created the tables
        try:
            plan = writer.plan("concurrent8", worker)
            barrier.wait(timeout=300)
            started = time.perf_counter()
            writer.write(plan)
            out.put(("ok", worker, (started, time.perf_counter())))
        finally:
            writer.close()
    except BaseException:
        out.put(("error", worker, traceback.format_exc(limit=8)))  # the parent raises it
        barrier.abort()


def run_concurrent(kind: str, dsn: str, schema: str, tag: str, processes: int = 8) -> float:
    """Events per second of `processes` writer processes, from the common start to the last finish.
    A worker that fails or dies fails the bench at once, naming the worker and its error."""
    WRITERS[kind](dsn, schema, tag).close()  # tables and functions, once: the workers race on DDL
    context = multiprocessing.get_context("spawn")
    barrier, out = context.Barrier(processes), context.Queue()
    workers = [
        context.Process(target=_concurrent_worker, args=(kind, dsn, schema, tag, w, barrier, out))
        for w in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        spans = _collect_spans(kind, workers, out)
    finally:  # on a failure the others may still be writing, or waiting at the barrier
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()
                worker.join()
    runs, per_run, size = SHAPES["concurrent8"]
    return (
        processes * runs * per_run * size / (max(end for _, end in spans) - min(start for start, _ in spans))
    )


def _collect_spans(kind: str, workers: list[Any], out: Any) -> list[tuple[float, float]]:
    """Each worker's (start, end); raises as soon as one reports an error or exits without a report."""
    spans: dict[int, tuple[float, float]] = {}
    while len(spans) < len(workers):
        try:
            status, index, detail = out.get(timeout=1.0)
        except queue.Empty:
            for index, worker in enumerate(workers):
                if index not in spans and worker.exitcode is not None and out.empty():
                    raise RuntimeError(
                        f"{kind} concurrent8 worker {index} exited with code {worker.exitcode}"
                        " without a result"
                    ) from None
            continue
        if status == "error":
            raise RuntimeError(f"{kind} concurrent8 worker {index} failed:\n{detail}")
        spans[index] = detail
    return list(spans.values())


def versus(dsn: str, rounds: int) -> dict[str, float]:
    """Each library's median over `rounds` rounds of each shape, the libraries alternating which goes
    first, and a checkpoint before each timed shape (as pgbench does before a run), so that the
    server's periodic one does not land inside a shape that takes about a second. With the best of 2
    rounds and no checkpoint, three quiet runs of the same code in a row gave batched ratios of 1.54,
    1.04 and 0.85 (2026-11-27)."""
    rates: dict[str, list[float]] = {}
    for round_no in range(rounds):
        order = ("runstate", "eventsourcing") if round_no % 2 == 0 else ("eventsourcing", "runstate")
        for kind in order:
            for shape in SHAPES:
                log(f"round {round_no + 1}: {kind} {shape} ...")
                checkpoint(dsn)
                if shape == "concurrent8":
                    rate = run_concurrent(kind, dsn, SCHEMA, f"r{round_no}")
                else:
                    rate = run_shape(kind, dsn, SCHEMA, shape, f"r{round_no}")
                rates.setdefault(f"{kind}_{shape}", []).append(rate)
    medians = {key: statistics.median(values) for key, values in rates.items()}
    figures = {f"{key}_events_per_s": round(value, 1) for key, value in medians.items()}
    for shape in SHAPES:
        figures[f"vs_eventsourcing_{shape}"] = round(
            medians[f"runstate_{shape}"] / medians[f"eventsourcing_{shape}"], 2
        )
    return figures


def checkpoint(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


# -- indexes, raw floor, resume, snowflake -----------------------------------------------------


def without_indexes(dsn: str, rounds: int) -> float:
    """The batched shape in a schema without the §6.2 indexes (event_type BTREE; event_data GIN before 009)."""
    store = PostgresEventStore(dsn, schema="bench_noidx", pool_size=1)
    store.ensure_schema()
    store.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "DROP INDEX IF EXISTS bench_noidx.idx_run_events_event_type, bench_noidx.idx_run_events_event_data"
        )
    return statistics.median(
        run_shape("runstate", dsn, "bench_noidx", "batched", f"n{r}") for r in range(rounds)
    )


def raw_floor(dsn: str) -> float:
    """psycopg executemany of the batched shape's rows into a bare table (no keys, no indexes)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {SCHEMA}.raw_events (run_id text, run_seq bigint, event_type text,"
            " step_id text, event_data jsonb, idempotency_key text, emitted_at timestamptz)"
        )
    rows = [
        [
            (f"raw-{b}", i + 1, e.event_type, e.step_id, json.dumps(e.data), e.idempotency_key, e.emitted_at)
            for i, e in enumerate(make_events(f"raw-{b}", 100))
        ]
        for b in range(200)
    ]
    with psycopg.connect(dsn) as conn:
        insert = f"INSERT INTO {SCHEMA}.raw_events VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s)"

        def write() -> None:
            for batch in rows:
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(insert, batch)

        return 200 * 100 / timed(write)


def full_replay(store: PostgresEventStore, run_id: str) -> RunSnapshot:
    snapshot, after = RunSnapshot.empty(run_id), 0
    while events := store.fetch(run_id, after_seq=after, limit=10_000):
        snapshot = fold(snapshot, events)
        after = events[-1].run_seq
    return snapshot


def bench_resume(dsn: str, events_total: int, repeats: int) -> dict[str, Any]:
    """Resume with the snapshot at the tail (best case) and 50 events before it (the honest case)."""
    store = PostgresEventStore(dsn, schema=SCHEMA)
    figures: dict[str, Any] = {}
    try:
        for label, total in (("at_tail", events_total), ("50_before_tail", events_total + 50)):
            run_id = f"replay-{label}"
            for start in range(0, total, 1000):
                store.append_batch(run_id, make_events(run_id, min(1000, total - start), start))
            resumed, replayed = [], []
            for _ in range(repeats):
                got: list[RunSnapshot] = []
                resumed.append(timed(lambda: got.append(store.resume(run_id).run_snapshot(run_id))))
                got.append(full_replay(store, run_id))
                replayed.append(timed(lambda: full_replay(store, run_id)))
                if not got[0].same_state(got[1]):
                    raise RuntimeError("resume from the snapshot and the full replay disagree")
            point = store.resume(run_id)
            figures[f"resume_ms_snapshot_{label}"] = round(statistics.median(resumed) * 1000, 2)
            figures[f"resume_events_replayed_{label}"] = len(point.events)
            figures[f"resume_speedup_{label}"] = round(
                statistics.median(replayed) / statistics.median(resumed), 1
            )
        figures["resume_ms_full_replay"] = round(statistics.median(replayed) * 1000, 2)
    finally:
        store.close()
    return figures


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
            plan = [make_events(f"sf-{b % 5}", 100, (b // 5) * 100) for b in range(batches)]
            seconds = timed(lambda: [store.append_batch(events[0].run_id, events) for events in plan])
        finally:
            store.close()
    return batches * 100 / seconds


def load_figures(load_at_start: float) -> dict[str, Any]:
    """The 1-minute load average at the start and the end; a loaded machine drifts every ratio towards
    1 (both sides wait for the CPU), so a line that did not start quiet says so."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_1m_start": round(load_at_start, 2),
        "load_1m_end": round(os.getloadavg()[0], 2),
        "quiet": load_at_start <= QUIET_LOAD,
    }


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` drops the bench database
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds of each shape per library (median kept)"
    )
    parser.add_argument("--replay-events", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2, help="resume timings (median)")
    parser.add_argument("--sf-batches", type=int, default=10, help="batches of 100 on fakesnow (0: skip)")
    args = parser.parse_args()

    load_at_start = os.getloadavg()[0]
    name, dsn = create_database(args.admin_url)
    started = time.perf_counter()
    try:
        figures = versus(dsn, args.rounds)
        log("batched without the §6.2 indexes ...")
        figures["batched_without_6_2_indexes_per_s"] = round(without_indexes(dsn, args.rounds), 1)
        log("raw executemany floor ...")
        figures["raw_insert_rows_per_s"] = round(raw_floor(dsn), 1)
        log(f"resume on a {args.replay_events}-event run ...")
        figures.update(bench_resume(dsn, args.replay_events, args.repeats))
        if args.sf_batches:
            log("snowflake (fakesnow) batches ...")
            figures["snowflake_batched_events_per_s"] = round(bench_snowflake(args.sf_batches), 1)
    finally:
        drop_database(args.admin_url, name)
    figures["floor_1x_met"] = all(figures[f"vs_eventsourcing_{s}"] >= 1.0 for s in SHAPES)
    figures["goal_1_5x_batched_concurrent_met"] = all(
        figures[f"vs_eventsourcing_{s}"] >= 1.5 for s in ("batched", "concurrent8")
    )
    figures["params"] = {
        "rounds": args.rounds,
        "replay_events": args.replay_events,
        "sf_batches": args.sf_batches,
        "snapshot_interval": 100,
    }
    figures["seconds"] = round(time.perf_counter() - started, 1)
    figures.update(load_figures(load_at_start))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
