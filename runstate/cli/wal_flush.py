"""`runstate wal flush [--dataset X]`: flush Pending WAL rows now, in-process, fenced per shard.

`wal tick` asks the sensor, which may skip a shard flushed less than its run interval ago; this verb
does not wait for the timer. It runs `flush_wal` in this process as one run per shard with work, tagged
with its shard like the daemon's: while it runs, the sensor sees the shard held and starts no other
flush of it. Two fences keep one flush per shard:
- against other `runstate wal flush` commands, a session advisory lock per (WAL table, shard) in
  runstate's database, held while the shard is planned and flushed: six racing commands made six runs
  for two shards, which run tags cannot stop (an in-process run has no queue to wait in). The lock's
  session names the run it flushes for; a command paused past the dead bound keeps its session, so a
  waiting command that finds that run dead (and reports it failed) ends the session and takes the shard;
- against the daemon's runs, the shard's live run (its heartbeat is fresh) is waited for, briefly; if it
  still holds the shard then, it is named and left to flush the shard's rows itself.
The shard's rows are planned once both fences are passed, so a command that waited finds the rows the
other flushed applied, and says so. Every shard gets a line: what was flushed, or why not.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from typing import Any

import click

POLL_S = 1.0
# Postgres keeps 63 bytes of an application name: a run id (36) fits after "wal flush pid N run ".
RUN_IN_NAME = re.compile(r" run ([0-9a-f-]{36})$")


def _pending_keys(wal: Any, dataset_id: str | None) -> list[Any]:
    """One dataset's rows after its LastAppliedSeq (read from the table, not the lagging index), or
    every Pending row."""
    from runstate.wal import WalKey
    from runstate.wal.changes import validate_dataset_id

    table = wal.wal_table()
    if dataset_id is None:
        return [WalKey(row.dataset_id, row.seq) for row in table.pending()]
    validate_dataset_id(dataset_id)
    applied = table.meta(dataset_id).last_applied_seq
    return [WalKey(dataset_id, seq) for seq in range(applied + 1, table.max_seq(dataset_id) + 1)]


def _plans(wal: Any, dataset_id: str | None) -> list[Any]:
    from runstate.wal import plan_batches
    from runstate.wal.shards import plan_shards

    keys = _pending_keys(wal, dataset_id)
    return plan_shards(plan_batches(keys, max_batch_size=wal.max_batch_size), wal.flush_shards)


def _wait_for_shard(instance: Any, shard: int, deadline: float) -> Any:
    """The shard's live flush run once `deadline` has passed, or None as soon as the shard is free."""
    from runstate.defs.wal.sensors import shard_runs

    while True:
        holder = shard_runs(instance, shard).holder
        if holder is None or time.monotonic() >= deadline:
            return holder
        time.sleep(POLL_S)


class ShardFences:
    """Session advisory locks in runstate's database, one per (WAL table, shard). A command that dies
    loses its connection, and its locks with it."""

    def __init__(self, pg_url: str, wal_table: str) -> None:
        import psycopg

        from runstate.wal import WalServiceError

        self._table = wal_table
        try:
            self._conn = psycopg.connect(
                pg_url, autocommit=True, application_name=f"wal flush pid {os.getpid()}"
            )
        except psycopg.OperationalError as error:
            raise WalServiceError(
                f"wal flush fences its shards in runstate's database (RUNSTATE_PG_URL), which did not "
                f"answer: {' '.join(str(error).split())}"
            ) from None

    def _key(self, shard: int) -> int:
        digest = hashlib.sha256(f"runstate wal flush\x1f{self._table}\x1f{shard}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    def acquire(self, shard: int, deadline: float, instance: Any) -> bool:
        """Take the shard's lock, waiting for another command's until `deadline`; a holder whose run is
        dead loses it at once."""
        key = self._key(shard)
        while not self._conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
            if not self._take_over_from_a_dead_run(shard, instance) and time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True

    def name_run(self, run_id: str) -> None:
        """Name the run this command flushes for on its lock's session, for a waiting command to judge."""
        name = f"wal flush pid {os.getpid()} run {run_id}"
        self._conn.execute("SELECT set_config('application_name', %s, false)", (name,))

    def _holding_session(self, shard: int) -> tuple[int, str] | None:
        key = self._key(shard) & 0xFFFF_FFFF_FFFF_FFFF
        return self._conn.execute(
            "SELECT a.pid, a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
            " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND l.classid = %s AND l.objid = %s",
            (key >> 32, key & 0xFFFF_FFFF),
        ).fetchone()

    def _take_over_from_a_dead_run(self, shard: int, instance: Any) -> bool:
        """End the holding session when the run it names is dead (judged, and reported failed, as the
        sensors judge runs); True when it was ended."""
        import dagster as dg

        from runstate.defs.runs.liveness import check_runs

        holding = self._holding_session(shard)
        named = RUN_IN_NAME.search(holding[1]) if holding else None
        if named is None:  # no run yet: the holder is still planning (a killed one loses its session)
            return False
        records = instance.get_run_records(filters=dg.RunsFilter(run_ids=[named.group(1)]))
        if not records or not check_runs(instance, records)[0].dead:
            return False
        return self._conn.execute("SELECT pg_terminate_backend(%s)", (holding[0],)).fetchone()[0]

    def holder(self, shard: int) -> str:
        """Who holds the shard's lock: the other command's application name."""
        holding = self._holding_session(shard)
        return f"runstate {holding[1]}" if holding else "another runstate wal flush"

    def release(self, shard: int) -> None:
        self._conn.execute("SELECT pg_advisory_unlock(%s)", (self._key(shard),))

    def close(self) -> None:
        self._conn.close()


def _flush_shard(defs: Any, instance: Any, wal: Any, plan: Any, fences: ShardFences) -> str | None:
    """Execute the shard's flush run; a problem to report, or None."""
    from dagster._core.utils import make_new_run_id

    from runstate.defs.ticking import execute_run
    from runstate.defs.wal.sensors import FLUSH_JOB, batch_runs, flush_run_request

    runs = batch_runs(instance, plan.key)
    request = flush_run_request(plan, runs.dead + runs.succeeded, wal)
    job = defs.resolve_job_def(FLUSH_JOB)
    run_id = make_new_run_id()
    fences.name_run(run_id)
    result = execute_run(job, instance, run_config=request.run_config, tags=request.tags, run_id=run_id)
    for event in result.asset_materializations_for_node("flush_wal_shard"):
        version = event.metadata["version"].value
        click.echo(f"{event.partition}: {event.metadata['rows'].value} row(s) applied, version {version}")
    flushed = result.output_for_node("flush_wal_shard") if result.success else None
    if flushed is None:
        return f"shard {plan.shard}: run {result.run_id} FAILED"
    click.echo(
        f"shard {plan.shard}: run {result.run_id} flushed {flushed} of {len(plan.datasets)} dataset(s)"
    )
    if flushed < len(plan.datasets):
        return f"shard {plan.shard}: run {result.run_id} left datasets unflushed (see its logs)"
    return None


def _flush_fenced(
    defs: Any,
    instance: Any,
    wal: Any,
    fences: ShardFences,
    dataset_id: str | None,
    shard: int,
    deadline: float,
) -> str | None:
    """With the shard's lock held: wait for a daemon run of the shard, then plan its rows and flush them."""
    holder = _wait_for_shard(instance, shard, deadline)
    if holder is not None:
        return f"shard {shard} is held by {holder.describe()}: that run flushes its rows"
    plan = next((plan for plan in _plans(wal, dataset_id) if plan.shard == shard), None)
    if plan is None:
        click.echo(f"shard {shard}: nothing left to flush (another flush applied its rows meanwhile)")
        return None
    return _flush_shard(defs, instance, wal, plan, fences)


@click.command()
@click.option("--dataset", "dataset_id", default=None, help="Flush only this dataset (default: every one).")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(0, 600),
    default=30.0,
    show_default=True,
    help="Seconds to wait for another flush of the same shard (a run or a command) to end.",
)
def flush(dataset_id: str | None, wait_s: float) -> None:
    """Flush Pending WAL rows now, in-process (one flush_wal run per shard with work)."""
    from runstate.config import settings
    from runstate.defs.ticking import RunInterrupted, default_defs, default_instance

    defs = default_defs()
    wal = defs.resources["wal"]
    shards = [plan.shard for plan in _plans(wal, dataset_id)]
    if not shards:
        click.echo("nothing to flush: no Pending rows" + (f" for {dataset_id!r}" if dataset_id else ""))
        return
    instance, problems = default_instance(), []
    fences = ShardFences(settings().pg_url, wal.table)
    try:
        for index, shard in enumerate(shards):
            deadline = time.monotonic() + wait_s
            if not fences.acquire(shard, deadline, instance):
                problems.append(
                    f"shard {shard} is being flushed by {fences.holder(shard)}: that command flushes its rows"
                )
                continue
            try:
                problems.append(_flush_fenced(defs, instance, wal, fences, dataset_id, shard, deadline))
            except RunInterrupted:
                if index + 1 < len(shards):
                    problems.append(f"shard(s) {', '.join(map(str, shards[index + 1 :]))} not flushed")
                raise
            finally:
                fences.release(shard)
    finally:
        fences.close()
        for problem in filter(None, problems):
            click.echo(problem, err=True)
    if any(problems):
        raise SystemExit(1)


def install(wal: click.Group) -> None:
    wal.add_command(flush)
