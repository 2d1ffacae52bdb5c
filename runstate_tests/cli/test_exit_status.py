"""Every CLI verb exits 0, 1 or 2, never by a signal: read verbs run many times as real processes.

`wal read` died with SIGABRT at interpreter exit, after printing its answer, a few runs in a hundred:
pyarrow's native teardown racing a thread still alive, with every pyarrow wheel and allocator tried.
The console script now exits past the interpreter's finalization and the native destructors
(`runstate.cli.entry`). Two tests keep it so:
- `test_the_console_script_skips_the_interpreters_finalization` proves the mechanism every run: an
  object that only finalization would destroy is never destroyed, and the status still comes through.
- the loop runs each read verb as a real process against real data: 10 runs of `wal read` (which died
  in 2 runs of 50 before the fix) and 5 of each other verb. Every run is a whole interpreter (boto3,
  pyarrow, psycopg imported), so runs are what it costs; the subprocesses run a few at a time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runstate.eventstore import EventType, NewEvent, PostgresEventStore
from runstate.maintenance import CachedTable, MaintenanceStore
from runstate.wal import BlobStore, WalTable, flush_dataset
from runstate_tests.wal.shell import WalWorld

RUNSTATE = str(Path(sys.executable).parent / "runstate")
PARALLEL = 4
CLEAN_EXITS = {0, 1, 2}


@pytest.fixture
def env(world: WalWorld, pg_database: str, pg_schema: str) -> dict[str, str]:
    """Real data behind each verb: a dataset of several flushed batches, a live and an archived run, a job."""
    table, blobs = WalTable(world.dynamodb, world.table), BlobStore(world.s3, world.bucket, world.prefix)
    for batch in range(4):
        seqs = [world.append("orders", f"k{batch}-{i}", {"batch": batch, "i": i}) for i in range(20)]
        flush_dataset(table, blobs, "orders", seqs)
    with PostgresEventStore(pg_database, schema=pg_schema) as store:
        store.ensure_schema()
        long_ago = datetime.now(UTC) - timedelta(days=200)
        store.append_batch(
            "old-run",
            [
                NewEvent("old-run", EventType.RUN_STARTED, long_ago),
                NewEvent("old-run", EventType.RUN_COMPLETED, long_ago + timedelta(minutes=1)),
            ],
        )
        store.append(NewEvent("live-run", EventType.RUN_STARTED, datetime.now(UTC)))
        assert store.archive(90) >= 1
    with MaintenanceStore(pg_database, schema=pg_schema) as maintenance:
        maintenance.ensure_schema()
        maintenance.cache.replace_table_cache([CachedTable("db", "orders", True, {})])
        maintenance.submit("db", "orders", ["rewrite_manifests"])
    return {
        **os.environ,
        "RUNSTATE_PG_URL": pg_database,
        "RUNSTATE_SCHEMA": pg_schema,
        "RUNSTATE_EVENTSTORE": "postgres",
        "RUNSTATE_AWS_ENDPOINT_URL": world.endpoint,
        "RUNSTATE_WAL_TABLE": world.table,
        "RUNSTATE_BLOB_BUCKET": world.bucket,
        "RUNSTATE_BLOB_PREFIX": world.prefix,
    }


VERBS = {
    "wal read": ["wal", "read", "--dataset", "orders"],
    "wal status": ["wal", "status"],
    "events show (live)": ["events", "show", "live-run"],
    "events show (archived)": ["events", "show", "old-run"],
    "maintenance status": ["maintenance", "status"],
    "db status": ["db", "status"],
}
RUNS = {verb: 10 if verb == "wal read" else 5 for verb in VERBS}


def test_read_verbs_never_end_by_a_signal(env: dict[str, str]) -> None:
    def once(verb: str) -> tuple[str, int, str]:
        done = subprocess.run([RUNSTATE, *VERBS[verb]], env=env, capture_output=True, text=True, timeout=300)
        return verb, done.returncode, done.stderr[-300:]

    jobs = [verb for verb, runs in RUNS.items() for _ in range(runs)]
    with ThreadPoolExecutor(PARALLEL) as pool:
        outcomes = list(pool.map(once, jobs))

    statuses = Counter((verb, code) for verb, code, _ in outcomes)
    unclean = [(verb, code, err) for verb, code, err in outcomes if code not in CLEAN_EXITS]
    assert not unclean, f"exit statuses {dict(statuses)}; first: {unclean[0]}"
    assert all(code == 0 for _, code, _ in outcomes), dict(statuses)  # real data: every call succeeds


# An object that only the interpreter's finalization destroys (builtins are cleared last); its __del__
# leaves a file. `entry` then ends the process by os._exit with click's status.
FINALIZATION_PROBE = """
import builtins, sys
from runstate.cli import entry

class Probe:
    def __del__(self, write=open, path=sys.argv[1]):  # bound now: finalization clears the builtins
        write(path, "w").write("finalized")

builtins._runstate_probe = Probe()
sys.argv = ["runstate", *sys.argv[2:]]
entry()
"""


@pytest.mark.parametrize("args, status", [(["--version"], 0), (["no-such-verb"], 2)])
def test_the_console_script_skips_the_interpreters_finalization(tmp_path: Path, args: list[str], status: int):
    marker = tmp_path / "finalized"
    plain = [sys.executable, "-c", FINALIZATION_PROBE.replace("entry()", "sys.exit(0)"), str(marker)]
    assert subprocess.run(plain, timeout=120).returncode == 0 and marker.exists()  # the probe works
    marker.unlink()

    done = subprocess.run([sys.executable, "-c", FINALIZATION_PROBE, str(marker), *args], timeout=120)

    assert done.returncode == status
    assert not marker.exists(), "the interpreter was finalized: native destructors ran"


def test_the_console_script_ends_with_an_idle_thread_pool_alive():
    """A verb that read a run archived to the lake used pyiceberg, whose thread pool keeps idle workers:
    the exit joined them before concurrent.futures told them to stop, and hung after the answer."""
    code = (
        "from concurrent.futures import ThreadPoolExecutor\n"
        "pool = ThreadPoolExecutor(2)\n"
        "assert pool.submit(lambda: 1).result() == 1\n"
        "from runstate.cli import _python_shutdown\n"
        "_python_shutdown()\n"
        "print('ended')\n"
    )

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    assert done.returncode == 0 and done.stdout.strip() == "ended", done.stderr


def test_help_lists_every_verb_without_loading_a_driver_dagster_or_spark():
    """`runstate --help` names every verb (each verb's module is imported for its help line) and loads no
    database driver, Dagster or Spark: it answered in 0.33 s with psycopg loaded, 0.13 s without."""
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from runstate.cli import VERBS, main\n"
        "result = CliRunner().invoke(main, ['--help'])\n"
        "assert result.exit_code == 0 and all(verb in result.output for verb in VERBS), result.output\n"
        "heavy = ('psycopg', 'snowflake.connector', 'dagster', 'pyspark', 'boto3')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
