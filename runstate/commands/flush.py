"""Flush now (`runstate wal flush`) and tick the flush sensor (`runstate wal tick`).

`tick_wal` asks the sensor, which may skip a shard flushed less than its run interval ago; `flush_now`
does not wait for the timer. It plans with the sensor's planner (`runstate.wal.planning.plan_flush`) and
executes `flush_wal` in this process as one run per shard with work, built by the sensor's
`flush_run_request` and so tagged with its shard like the daemon's: while it runs, the sensor sees the
shard held and starts no other flush of it. Two fences keep one flush per shard:
- against other `runstate wal flush` commands, a session advisory lock per (WAL table, shard) in
  runstate's database, held while the shard is planned and flushed: six racing commands made six runs
  for two shards, which run tags cannot stop (an in-process run has no queue to wait in). The lock's
  session names the run it flushes for; a command paused past the dead bound keeps its session, so a
  waiting command that finds that run dead (and reports it failed) ends the session and takes the shard;
- against the daemon's runs, the shard's live run (its heartbeat is fresh) is waited for, briefly; if it
  still holds the shard then, it is named and left to flush the shard's rows itself.
The shard's rows are planned once both fences are passed, so a command that waited finds the rows the
other flushed applied, and says so. Every shard gets a report: what was flushed, or why not.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import dagster as dg
from dagster._core.utils import make_new_run_id

from runstate.commands.instance import default_instance
from runstate.commands.ticking import (
    RunInterrupted,
    TickResult,
    default_defs,
    execute_run,
    tick_sensor,
)
from runstate.config import settings
from runstate.defs.runs.liveness import RunLiveness, check_runs
from runstate.defs.wal.resources import WalResource
from runstate.defs.wal.sensors import FLUSH_JOB, batch_runs, flush_run_request, shard_runs
from runstate.wal import WalError, WalServiceError
from runstate.wal.planning import FlushPlan, plan_flush
from runstate.wal.shards import ShardPlan

SENSOR_NAME = "wal_sensor"
FLUSH_OP = "flush_wal_shard"
POLL_S = 1.0
# Postgres keeps 63 bytes of an application name: a run id (36) fits after "wal flush pid N run ".
RUN_IN_NAME = re.compile(r" run ([0-9a-f-]{36})$")


@dataclass
class ShardReport:
    """What a flush did for one shard: lines to show (what was applied), and a problem, if any."""

    lines: list[str] = field(default_factory=list)
    problem: str | None = None


def plan(wal: WalResource, dataset_id: str | None) -> FlushPlan:
    """The flush sensor's plan of the Pending rows (one dataset's when `dataset_id` is given)."""
    return plan_flush(
        wal.wal_table(), max_batch_size=wal.max_batch_size, shards=wal.flush_shards, dataset_id=dataset_id
    )


def _wait_for_shard(instance: dg.DagsterInstance, shard: int, deadline: float) -> RunLiveness | None:
    """The shard's live flush run once `deadline` has passed, or None as soon as the shard is free."""
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

    def acquire(self, shard: int, deadline: float, instance: dg.DagsterInstance | None) -> bool:
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

    def _take_over_from_a_dead_run(self, shard: int, instance: dg.DagsterInstance | None) -> bool:
        """End the holding session when the run it names is dead (judged, and reported failed, as the
        sensors judge runs); True when it was ended."""
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


def _flush_shard(
    defs: dg.Definitions, instance: dg.DagsterInstance, wal: WalResource, plan: ShardPlan, fences: ShardFences
) -> ShardReport:
    """Execute the shard's flush run, as the sensor would request it."""
    runs = batch_runs(instance, plan.key)
    request = flush_run_request(plan, runs.dead + runs.succeeded, wal)
    run_id = make_new_run_id()
    fences.name_run(run_id)
    result = execute_run(
        defs.resolve_job_def(FLUSH_JOB),
        instance,
        run_config=request.run_config,
        tags=request.tags,
        run_id=run_id,
    )
    report = ShardReport()
    for event in result.asset_materializations_for_node(FLUSH_OP):
        version = event.metadata["version"].value
        report.lines.append(
            f"{event.partition}: {event.metadata['rows'].value} row(s) applied, version {version}"
        )
    flushed = result.output_for_node(FLUSH_OP) if result.success else None
    if flushed is None:
        report.problem = f"shard {plan.shard}: run {result.run_id} FAILED"
        return report
    report.lines.append(
        f"shard {plan.shard}: run {result.run_id} flushed {flushed} of {len(plan.datasets)} dataset(s)"
    )
    if flushed < len(plan.datasets):
        report.problem = f"shard {plan.shard}: run {result.run_id} left datasets unflushed (see its logs)"
    return report


def _flush_fenced(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    wal: WalResource,
    fences: ShardFences,
    dataset_id: str | None,
    shard: int,
    deadline: float,
) -> ShardReport:
    """With the shard's lock held: wait for a daemon run of the shard, then plan its rows and flush them."""
    holder = _wait_for_shard(instance, shard, deadline)
    if holder is not None:
        return ShardReport(problem=f"shard {shard} is held by {holder.describe()}: that run flushes its rows")
    shard_plan = plan(wal, dataset_id).shard(shard)
    if shard_plan is None:
        return ShardReport(
            [f"shard {shard}: nothing left to flush (another flush applied its rows meanwhile)"]
        )
    return _flush_shard(defs, instance, wal, shard_plan, fences)


def flush_now(dataset_id: str | None, wait_s: float) -> Iterator[ShardReport]:
    """Flush the Pending rows (of `dataset_id`, else every dataset's) now, one in-process run per shard
    with work: a report per shard, in shard order; none when nothing is pending.

    On Ctrl-C (RunInterrupted) the last report names the shards left unflushed, then the interrupt is
    raised again."""
    defs = default_defs()
    wal: WalResource = defs.resources["wal"]
    shards = [shard_plan.shard for shard_plan in plan(wal, dataset_id).shards]
    if not shards:
        return
    instance = default_instance()
    fences = ShardFences(settings().pg_url, wal.table)
    try:
        for index, shard in enumerate(shards):
            deadline = time.monotonic() + wait_s
            if not fences.acquire(shard, deadline, instance):
                yield ShardReport(
                    problem=f"shard {shard} is being flushed by {fences.holder(shard)}: "
                    "that command flushes its rows"
                )
                continue
            try:
                report = _flush_fenced(defs, instance, wal, fences, dataset_id, shard, deadline)
            except RunInterrupted:
                if index + 1 < len(shards):
                    left = ", ".join(map(str, shards[index + 1 :]))
                    yield ShardReport(problem=f"shard(s) {left} not flushed")
                raise
            finally:
                fences.release(shard)
            yield report
    finally:
        fences.close()


def tick_wal() -> TickResult:
    """One tick of wal_sensor, its flush runs executed in-process. A WalError the sensor raised (Dagster
    wraps what a sensor raises) is raised as itself, for the CLI's one error mapper."""
    try:
        return tick_sensor(SENSOR_NAME)
    except Exception as error:
        cause = _wal_cause(error)
        if cause is None:
            raise
        raise cause from None


def _wal_cause(error: BaseException) -> BaseException | None:
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, WalError):
            return seen
        seen = getattr(seen, "user_exception", None) or seen.__cause__
    return None
