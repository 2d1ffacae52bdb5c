"""Where an append's time goes, in figures that do not drift with the machine's load.

    .venv/bin/python bench/eventstore_profile.py [--admin-url URL] [--shape single|batched|...] [--cprofile N]

For each library of bench/eventstore.py (runstate, eventsourcing) and each single-process shape
(single, batched, and concurrent8's plan written by one process), on a fresh database:
- `round_trips_per_append`: client waits for the server, counted from the libpq protocol trace
  (a run of backend messages after frontend ones is one round trip);
- `statements_per_append`: the frontend Parse/Bind/Query messages of the trace, per append;
- `client_cpu_us_per_event`: the writer process's CPU time (time.process_time), per event;
- `server_cpu_us_per_event`: the CPU time of the writer's server processes (/proc/PID/stat: a local
  server only), per event; `wal_bytes_per_event`: the WAL the server wrote meanwhile;
- with `pg_stat_statements` loaded on the server (shared_preload_libraries): each statement's calls,
  mean execution time, WAL bytes and buffers touched per append (the server's side; times do drift
  with load, WAL bytes and buffers do not);
- with `--cprofile N`: the N costliest functions of the client (cumulative), for runstate;
- with `--perf` (Linux `perf`, a local server): the server backends sampled while the writer works,
  `server_us_per_event_by_part`: where the server's CPU goes, by the Postgres function each sample is in
  (btree and GIN index inserts, the heap insert, JSONB parsing, the commit, array input, protocol reads).
It prints one JSON line per library and shape.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import create_database, drop_database  # noqa: E402  (bench/ is the script's folder)
from eventstore import SCHEMA, SHAPES, WRITERS  # noqa: E402

_STATEMENT_MESSAGES = ("\tQuery\t", "\tBind\t")


class Tracer:
    """Turns on the libpq protocol trace of every connection a writer uses, one file each."""

    def __init__(self) -> None:
        self.folder = tempfile.TemporaryDirectory(prefix="es_trace_")
        self.files: dict[int, Any] = {}
        self.conns: list[psycopg.Connection] = []
        self.backends: dict[int, float] = {}  # backend pid -> its CPU seconds when first seen

    def restart(self) -> None:
        """Count from now: the CPU the backends used so far is not counted, nor the trace so far."""
        for pid in self.backends:
            self.backends[pid] = backend_cpu_seconds(pid)
        for conn in self.conns:
            handle = self.files[id(conn)]
            conn.pgconn.untrace()  # flushes libpq's own buffer into the file first
            os.ftruncate(handle.fileno(), 0)
            os.lseek(handle.fileno(), 0, os.SEEK_SET)
            self._trace(conn, handle)

    def server_cpu(self) -> float:
        return sum(backend_cpu_seconds(pid) - start for pid, start in self.backends.items())

    def watch(self, conn: psycopg.Connection) -> None:
        if id(conn) in self.files:
            return
        self.backends[conn.info.backend_pid] = backend_cpu_seconds(conn.info.backend_pid)
        handle = open(Path(self.folder.name) / f"{len(self.files)}.trace", "w")  # noqa: SIM115
        self._trace(conn, handle)
        self.files[id(conn)] = handle
        self.conns.append(conn)

    @staticmethod
    def _trace(conn: psycopg.Connection, handle: Any) -> None:
        conn.pgconn.trace(handle.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

    def counts(self) -> tuple[int, int]:
        """(round trips, statements) over every traced connection."""
        for conn in self.conns:
            if not conn.closed:
                conn.pgconn.untrace()  # flushes libpq's buffer
        trips = statements = 0
        for handle in self.files.values():
            handle.close()
            previous = "B"
            for line in Path(handle.name).read_text().splitlines():
                side = line.split("\t", 1)[0]
                trips += side == "B" and previous == "F"
                statements += side == "F" and any(m in line for m in _STATEMENT_MESSAGES)
                previous = side
        self.folder.cleanup()
        return trips, statements


PERF_HZ = 4000
# A sample counts for every part whose Postgres function is on its stack.
PERF_PARTS = {
    "btree_inserts": ("btinsert",),
    "gin_inserts": ("gininsert",),
    "heap_insert": ("heap_insert",),
    "jsonb_parse": ("jsonb_in",),
    "commit": ("CommitTransactionCommand",),
    "array_input": ("array_in", "array_recv"),
    "protocol_reads": ("pq_getbyte",),
}


class PerfRecorder:
    """`perf record` of some server backends, summarised as server microseconds per event by part."""

    def __init__(self, pids: list[int]) -> None:
        self.output = tempfile.NamedTemporaryFile(prefix="es_perf_", suffix=".data", delete=False)  # noqa: SIM115
        argv = ["perf", "record", "-e", "cpu-clock", "-F", str(PERF_HZ), "-g", "-o", self.output.name]
        self.process = subprocess.Popen(
            [*argv, "-p", ",".join(map(str, pids))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(1.0)  # perf attaches to the processes before the work starts

    def stop(self, events: int) -> dict[str, float]:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=60)
        script = subprocess.run(
            ["perf", "script", "-i", self.output.name], capture_output=True, text=True, check=True
        ).stdout
        os.unlink(self.output.name)
        counts = dict.fromkeys([*PERF_PARTS, "total"], 0)
        for sample in script.split("\n\n"):
            frames = {
                line.split()[1].split("+")[0] for line in sample.splitlines()[1:] if len(line.split()) > 1
            }
            if not frames:
                continue
            counts["total"] += 1
            for part, functions in PERF_PARTS.items():
                counts[part] += any(name in frames for name in functions)
        return {part: round(n / PERF_HZ * 1e6 / events, 2) for part, n in counts.items()}


def backend_cpu_seconds(pid: int) -> float:
    """User + system CPU of a server process (a local server only; 0 when it cannot be read)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wal_lsn(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'").fetchone()[0])


def traced_writer(kind: str, dsn: str, tag: str, tracer: Tracer) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:  # the bench's runstate writer made it there
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    writer = WRITERS[kind](dsn, SCHEMA, tag)
    # Every connection either library hands out: runstate's datastore lends them through connection()
    # and transaction(), eventsourcing's through get_connection().
    if kind == "runstate":
        owner, names = writer.store.datastore, ("connection", "transaction")
    else:
        owner, names = writer.datastore, ("get_connection",)
    for name in names:
        setattr(owner, name, _traced(getattr(owner, name), tracer))
    return writer


def _traced(lend: Any, tracer: Tracer) -> Any:
    @contextmanager
    def traced(*args: Any, **kwargs: Any) -> Iterator[psycopg.Connection]:
        with lend(*args, **kwargs) as conn:
            tracer.watch(conn)
            yield conn

    return traced


def server_statements(admin_url: str, dbname: str, appends: int) -> list[dict[str, Any]] | None:
    query = (
        "SELECT calls, total_exec_time, total_plan_time, wal_bytes, shared_blks_hit + shared_blks_read,"
        " shared_blks_dirtied, left(regexp_replace(query, '\\s+', ' ', 'g'), 90)"
        " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
        " WHERE d.datname = %s ORDER BY total_exec_time DESC LIMIT 12"
    )
    try:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            rows = conn.execute(query, (dbname,)).fetchall()
    except psycopg.Error:
        return None
    return [
        {
            "calls_per_append": round(calls / appends, 3),
            "exec_us_per_append": round(exec_ms * 1000 / appends, 1),
            "plan_us_per_append": round(plan_ms * 1000 / appends, 1),
            "wal_bytes_per_append": round(int(wal) / appends),
            "buffers_per_append": round(buffers / appends, 1),
            "dirtied_per_append": round(dirtied / appends, 2),
            "query": text,
        }
        for calls, exec_ms, plan_ms, wal, buffers, dirtied, text in rows
    ]


def reset_statements(admin_url: str) -> None:
    try:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
    except psycopg.Error:
        pass


def profile(kind: str, shape: str, admin_url: str, top: int, perf: bool = False) -> dict[str, Any]:
    name, dsn = create_database(admin_url)
    try:
        tracer = Tracer()
        writer = traced_writer(kind, dsn, "p", tracer)
        plan = writer.plan(shape)
        writer.write(plan[:5])  # connections open, statements prepared: what every later append finds
        plan = plan[5:]
        reset_statements(admin_url)
        tracer.restart()
        wal = wal_lsn(dsn)
        profiler = cProfile.Profile() if top and kind == "runstate" else None
        recorder = PerfRecorder(list(tracer.backends)) if perf else None
        cpu, wall = time.process_time(), time.perf_counter()
        if profiler:
            profiler.enable()
        writer.write(plan)
        if profiler:
            profiler.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        appends, events = len(plan), len(plan) * SHAPES[shape][2]
        by_part = recorder.stop(events) if recorder else None
        server_cpu, wal = tracer.server_cpu(), wal_lsn(dsn) - wal
        trips, statements = tracer.counts()
        writer.close()
        figures: dict[str, Any] = {
            "library": kind,
            "shape": shape,
            "appends": appends,
            "events": events,
            "round_trips_per_append": round(trips / appends, 2),
            "statements_per_append": round(statements / appends, 2),
            "client_cpu_us_per_event": round(cpu * 1e6 / events, 1),
            "server_cpu_us_per_event": round(server_cpu * 1e6 / events, 1),
            "wal_bytes_per_event": round(wal / events),
            "wall_us_per_event_under_load": round(wall * 1e6 / events, 1),
            "server": server_statements(admin_url, name, appends),
        }
        if by_part:
            figures["server_us_per_event_by_part"] = by_part
        if profiler:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
            figures["cprofile"] = out.getvalue()
        return figures
    finally:
        drop_database(admin_url, name)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES), help="default: all")
    parser.add_argument("--library", action="append", choices=sorted(WRITERS), help="default: both")
    parser.add_argument("--cprofile", type=int, default=0, help="print the N costliest client functions")
    parser.add_argument("--perf", action="store_true", help="sample the server backends with Linux perf")
    args = parser.parse_args()
    for shape in args.shape or list(SHAPES):
        for kind in args.library or list(WRITERS):
            figures = profile(kind, shape, args.admin_url, args.cprofile, args.perf)
            report = figures.pop("cprofile", None)
            print(json.dumps(figures), flush=True)
            if report:
                print(report, file=sys.stderr)


if __name__ == "__main__":
    main()
