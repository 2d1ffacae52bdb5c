"""The event store as it grows: prints ONE JSON line per size, runstate beside the eventsourcing library.

    .venv/bin/python bench/eventstore_growth.py [--sizes 0,500000,1000000] [--with-2m] [--rounds 3]

Both stores are filled to each size in turn (0, 0.5M and 1M events; 2M with --with-2m), each in a database
of its own on the same server: runs of 100 events, 1 % of them finished 100 days ago, which runstate then
archives (`archive(older_than_days=30)`). At each size, in rounds that alternate which library goes
first, each library is timed on:
- feed: 10 pages of 1,000 events of its global feed (runstate `fetch_all`, the peer's
  `select_notifications`) from the middle of what is stored;
- read: 50 whole runs of 100 events, spread evenly over the live runs stored (runstate `fetch`, the
  peer's `select_events`); 50 runs are written through each API at the start;
- append: 200 single-event appends over 20 new runs (`append`, `insert_events` of one event);
- batch: 20 batches of 100 events, each a new run (`append_batch`, `insert_events`);
and the line carries each figure's median over the rounds, runstate / eventsourcing ratios, and the bytes
per event of the event tables with their indexes (runstate: run_events and run_events_archive; the
peer: its one table), measured after a VACUUM ANALYZE of both.

The fill is server-side and the same for both (INSERT ... SELECT over generate_series, into the tables
with their indexes, so that they grow as appends grow them): payloads of about 90 bytes of JSON, distinct
per event; runstate's rows copy the columns of a template run appended through its API (so the file runs
unchanged against any runstate whose tables keep their column names), with its state snapshot, and
feed positions that ascend at the right edge of their index, as appends' do. Reads decode
each payload on both sides (runstate's rows come decoded; the peer's through its JSON transcoder).
It uses only the API that runstate's main had at d5f55a9, so the same file measures before
and after. Quote only lines with "quiet": true (run it through ../shared/tools/quiet).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import create_database, drop_database, load_end, load_start  # noqa: E402
from eventstore import EventsourcingWriter, make_events, payload  # noqa: E402  (bench/eventstore.py)

from runstate.eventstore import PostgresEventStore  # noqa: E402

SCHEMA = "growth"
RUN_EVENTS = 100
TEMPLATE = "template"
FEED_PAGES, PAGE = 10, 1_000
READ_RUNS = 50
SINGLE_RUNS, SINGLES_PER_RUN = 20, 10
BATCHES = 20
# The payload both libraries store, as compact JSON (the peer's transcoder writes it so).
PAYLOAD_SQL = """'{"i":' || n || ',"rows":' || n * 7 || ',"host":"worker-3","tags":["bench","eventstore"]}'"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def rate(events: int, work: Callable[[], Any]) -> float:
    started = time.perf_counter()
    work()
    return events / (time.perf_counter() - started)


class Runstate:
    name = "runstate"

    def __init__(self, dsn: str):
        self.dsn = dsn
        self.store = PostgresEventStore(dsn, schema=SCHEMA, pool_size=2)
        self.store.ensure_schema()
        self.store.append_batch(TEMPLATE, make_events(TEMPLATE, RUN_EVENTS))
        self.filled = 0  # runs written by fill()
        self.readable = [f"read-{r}" for r in range(READ_RUNS)]
        for run_id in self.readable:
            self.store.append_batch(run_id, make_events(run_id, RUN_EVENTS))

    def sql(self, query: str, params: Any = None) -> list[tuple]:
        with psycopg.connect(self.dsn, autocommit=True, options=f"-c search_path={SCHEMA}") as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def fill(self, runs: int) -> None:
        """`runs` more runs of the template's rows, each with its own payloads and event ids, positions
        in fill order (below every appended event's), and its snapshot; then archive the 1 % of old ones."""
        first, last = self.filled, self.filled + runs - 1
        columns = [
            c
            for (c,) in self.sql(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s"
                " AND table_name = 'run_events' ORDER BY ordinal_position",
                (SCHEMA,),
            )
        ]
        own = {
            "run_id": "'fill-' || r",
            "event_id": "gen_random_uuid()",
            "event_data": f"({PAYLOAD_SQL})::jsonb",
            "emitted_at": "t.emitted_at - CASE WHEN r %% 100 = 0 THEN interval '100 days' ELSE interval '0' END",
            "persisted_at": "now()",
            # Ascending at the index's right edge, as positions are (002_event_feed.sql), and below the
            # fill's own transaction's: after every event appended before it, and visible once it commits.
            "position": f"(pg_current_xact_id()::text::bigint << 20) - {runs * RUN_EVENTS} + n",
        }
        values = ", ".join(own.get(c, f"t.{c}") for c in columns)
        self.sql(
            f"INSERT INTO run_events ({', '.join(columns)})"
            f" SELECT {values} FROM (SELECT *, (r - {first}) * {RUN_EVENTS} + t.run_seq - 1 AS n"
            f"  FROM generate_series(%s::int, %s::int) AS r, run_events t WHERE t.run_id = %s) t ORDER BY n",
            (first, last, TEMPLATE),
        )
        self.sql(
            "INSERT INTO run_state_snapshots (run_id, seq, kind, encoding, payload, checksum, raw_bytes,"
            " stored_bytes, reason) SELECT 'fill-' || r, seq, kind, encoding, payload, checksum, raw_bytes,"
            " stored_bytes, reason FROM generate_series(%s::int, %s::int) AS r, run_state_snapshots WHERE run_id = %s",
            (first, last, TEMPLATE),
        )
        self.sql(
            "INSERT INTO run_streams (run_id, last_seq, event_count, first_event_at, started_at, completed_at)"
            f" SELECT 'fill-' || r, {RUN_EVENTS}, {RUN_EVENTS}, now(), now(),"
            " now() - CASE WHEN r %% 100 = 0 THEN interval '100 days' ELSE interval '1 hour' END"
            " FROM generate_series(%s::int, %s::int) AS r",
            (first, last),
        )
        self.readable += [f"fill-{r}" for r in range(first, last + 1) if r % 100]  # 1 % is archived
        self.filled += runs
        self.store.archive(older_than_days=30)

    def feed(self, after: int) -> int:
        read = 0
        for _ in range(FEED_PAGES):
            page = self.store.fetch_all(after, limit=PAGE)
            if not page:
                break
            read, after = read + len(page), page[-1].position
        return read

    def feed_middle(self) -> int:
        """The position of the event half-way along the feed (set-up, not timed)."""
        rows = self.sql(
            "SELECT position FROM (SELECT position FROM run_events UNION ALL SELECT position"
            " FROM run_events_archive) e ORDER BY position OFFSET (SELECT (SELECT count(*) FROM run_events)"
            " + (SELECT count(*) FROM run_events_archive)) / 2 LIMIT 1"
        )
        return rows[0][0] if rows else 0

    def read(self, runs: list[str]) -> None:
        for run_id in runs:
            assert len(self.store.fetch(run_id, limit=PAGE)) == RUN_EVENTS

    def append(self, tag: str) -> None:
        for r in range(SINGLE_RUNS):
            for event in make_events(f"{tag}-single-{r}", SINGLES_PER_RUN):
                self.store.append(event)

    def batch(self, tag: str) -> None:
        for b in range(BATCHES):
            self.store.append_batch(f"{tag}-batch-{b}", make_events(f"{tag}-batch-{b}", RUN_EVENTS))

    def bytes_per_event(self) -> float:
        ((size, count),) = self.sql(
            "SELECT pg_total_relation_size('run_events') + pg_total_relation_size('run_events_archive'),"
            " (SELECT count(*) FROM run_events) + (SELECT count(*) FROM run_events_archive)"
        )
        return size / count

    def close(self) -> None:
        self.store.close()


class Eventsourcing:
    name = "eventsourcing"
    table = "es_events"

    def __init__(self, dsn: str):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        # bench/eventstore.py's writer: the library's datastore, recorder (table es_events) and transcoder.
        writer = EventsourcingWriter(dsn, SCHEMA, "growth")
        self.dsn, self.datastore, self.recorder = dsn, writer.datastore, writer.recorder
        self.transcoder, self.stored_event = writer.transcoder, writer.stored_event
        self.filled = 0
        self.readable = [uuid.uuid5(uuid.NAMESPACE_URL, f"read-{r}") for r in range(READ_RUNS)]
        for stream in self.readable:
            self.write(stream, RUN_EVENTS)

    def write(self, stream: uuid.UUID, count: int) -> None:
        encode, stored = self.transcoder.encode, self.stored_event
        self.recorder.insert_events(
            [stored(stream, v + 1, "bench:Event", encode(payload(v))) for v in range(count)]
        )

    def sql(self, query: str, params: Any = None) -> list[tuple]:
        with psycopg.connect(self.dsn, autocommit=True, options=f"-c search_path={SCHEMA}") as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    @staticmethod
    def stream(r: int) -> uuid.UUID:
        return uuid.uuid5(uuid.NAMESPACE_URL, f"fill-{r}")

    def fill(self, runs: int) -> None:
        first, last = self.filled, self.filled + runs - 1
        self.sql(
            f"INSERT INTO {self.table} (originator_id, originator_version, topic, state)"
            f" SELECT s.id, v, 'bench:Event', convert_to({PAYLOAD_SQL}, 'UTF8')"
            f" FROM (SELECT r, id FROM unnest(%s::uuid[]) WITH ORDINALITY AS u(id, r)) s,"
            f" generate_series(1, {RUN_EVENTS}) AS v, LATERAL (SELECT (s.r - 1) * {RUN_EVENTS} + v - 1 AS n) k"
            " ORDER BY n",
            ([self.stream(r) for r in range(first, last + 1)],),
        )
        self.readable += [self.stream(r) for r in range(first, last + 1) if r % 100]  # as runstate's
        self.filled += runs

    def feed(self, after: int) -> int:
        read, decode = 0, self.transcoder.decode
        for _ in range(FEED_PAGES):
            page = self.recorder.select_notifications(after, PAGE, inclusive_of_start=False)
            if not page:
                break
            [decode(n.state) for n in page]
            read, after = read + len(page), page[-1].id
        return read

    def feed_middle(self) -> int:
        """The notification id half-way along the feed (set-up, not timed)."""
        rows = self.sql(
            f"SELECT notification_id FROM {self.table} ORDER BY notification_id"
            f" OFFSET (SELECT count(*) FROM {self.table}) / 2 LIMIT 1"
        )
        return rows[0][0] if rows else 0

    def read(self, runs: list[uuid.UUID]) -> None:
        decode = self.transcoder.decode
        for stream in runs:
            events = self.recorder.select_events(stream, limit=PAGE)
            assert len([decode(e.state) for e in events]) == RUN_EVENTS

    def append(self, tag: str) -> None:
        encode, stored = self.transcoder.encode, self.stored_event
        for r in range(SINGLE_RUNS):
            stream = uuid.uuid5(uuid.NAMESPACE_URL, f"{tag}-single-{r}")
            for v in range(SINGLES_PER_RUN):
                self.recorder.insert_events([stored(stream, v + 1, "bench:Event", encode(payload(v)))])

    def batch(self, tag: str) -> None:
        for b in range(BATCHES):
            self.write(uuid.uuid5(uuid.NAMESPACE_URL, f"{tag}-batch-{b}"), RUN_EVENTS)

    def bytes_per_event(self) -> float:
        ((size, count),) = self.sql(
            f"SELECT pg_total_relation_size('{self.table}'), count(*) FROM {self.table}"
        )
        return size / count

    def close(self) -> None:
        self.datastore.close()


def measure(lib: Runstate | Eventsourcing, tag: str) -> dict[str, float]:
    """One round of the four figures, in events per second."""
    middle = lib.feed_middle()
    started = time.perf_counter()
    read = lib.feed(middle)
    figures = {"feed": read / (time.perf_counter() - started)}
    step = len(lib.readable) / READ_RUNS  # runs spread evenly over all that are stored
    runs = [lib.readable[int(i * step)] for i in range(READ_RUNS)]
    figures["read"] = rate(READ_RUNS * RUN_EVENTS, lambda: lib.read(runs))
    figures["append"] = rate(SINGLE_RUNS * SINGLES_PER_RUN, lambda: lib.append(tag))
    figures["batch"] = rate(BATCHES * RUN_EVENTS, lambda: lib.batch(tag))
    return figures


def vacuum(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
        conn.execute("CHECKPOINT")


def at_size(libs: list[Runstate | Eventsourcing], size: int, rounds: int) -> dict[str, Any]:
    line: dict[str, Any] = {"events": size, **load_start()}
    for lib in libs:
        runs = size // RUN_EVENTS - lib.filled
        if runs > 0:
            log(f"{lib.name}: filling to {size:,} events ...")
            lib.fill(runs)
        vacuum(lib.dsn)
    results: dict[str, dict[str, list[float]]] = {lib.name: {} for lib in libs}
    for round_no in range(rounds):
        order = libs if round_no % 2 == 0 else libs[::-1]
        for lib in order:
            log(f"{size:,} events, round {round_no + 1}: {lib.name} ...")
            for figure, value in measure(lib, f"s{size}-r{round_no}").items():
                results[lib.name].setdefault(figure, []).append(value)
    for lib in libs:
        for figure, values in results[lib.name].items():
            line[f"{lib.name}_{figure}_events_per_s"] = round(statistics.median(values), 1)
        line[f"{lib.name}_bytes_per_event"] = round(lib.bytes_per_event(), 1)
    for figure in ("feed", "read", "append", "batch"):
        ours, theirs = (line.get(f"{lib.name}_{figure}_events_per_s") for lib in libs)
        if ours and theirs:
            line[f"vs_eventsourcing_{figure}"] = round(ours / theirs, 3)
    line["vs_eventsourcing_bytes_per_event"] = round(
        line["runstate_bytes_per_event"] / line["eventsourcing_bytes_per_event"], 2
    )
    line.update(load_end())
    line["date"] = datetime.now(UTC).isoformat(timespec="seconds")
    return line


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` drops the bench databases
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--sizes", default="0,500000,1000000", help="event counts, ascending")
    parser.add_argument("--with-2m", action="store_true", help="add a size of 2,000,000 events")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per size (median kept)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] + ([2_000_000] if args.with_2m else [])
    if sizes != sorted(sizes) or any(s % RUN_EVENTS for s in sizes):
        parser.error(f"--sizes must ascend, each a multiple of {RUN_EVENTS}")

    made = [create_database(args.admin_url) for _ in range(2)]
    libs: list[Runstate | Eventsourcing] = []
    try:
        libs = [Runstate(made[0][1]), Eventsourcing(made[1][1])]
        for size in sizes:
            print(json.dumps(at_size(libs, size, args.rounds)), flush=True)
    finally:
        for lib in libs:
            lib.close()
        for name, _ in made:
            drop_database(args.admin_url, name)


if __name__ == "__main__":
    main()
