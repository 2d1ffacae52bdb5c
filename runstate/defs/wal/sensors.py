"""`wal_sensor`: the flush timer. It tails the WAL stream, sweeps the Pending index, plans batches, groups
them by flush shard and requests at most one `flush_wal` run per shard that has work. With always-on
flush runs (the resource's flush_always_on), every shard instead keeps one live run that holds its lease
and polls it: the sensor starts it (with the shard's plan) when the shard has none, starts its successor
when it asks for one, and takes the lease from a holder found dead (`runstate.defs.wal.always_on`). The
rest of this docstring is the on-demand mode.

Timing. The sensor evaluates every SENSOR_INTERVAL_S; a shard gets a run when it has Pending rows, no
live flush run (queued, starting or running), and its last flush run was requested at least
`min_run_interval_s` ago (15 s: at most 2 runs per shard per 30 s timer period). So a row waits for at
most one run interval plus a tick before its run is requested, whatever the number of datasets. A live
run of the shard lingers for new rows (`flush_linger_s`), so a held shard's rows are flushed by it.

Run keys and failures. The daemon never launches a run_key that already has a run, yet a plan whose
run failed must be flushed again once the fault clears. So a run_key is `<plan key>-g<generation>`:
the plan key is deterministic over (shard, batches), and the generation counts the runs of that plan
(found by the `runstate/wal_batch` tag) that are dead or succeeded (a dataset that failed inside a
successful run is planned again, and may give the same plan). Whether a run is alive comes from its
heartbeat (`runstate.defs.runs.liveness`): a run whose worker was killed outright never reports, so
the tick that finds its heartbeat stale reports it failed, within seconds.

Holders. While any run tagged with the shard holds it (QUEUED, NOT_STARTED, STARTING, STARTED or
CANCELING, whoever started it: this sensor, the CLI's `wal flush`, a day's compaction, a launch from the
UI) the shard gets nothing new. That is the one-flush-per-shard rule in an instance without the tag
limits of this project's dagster.yaml. Flush runs opt out of run retries: this sensor re-plans a dead
run's rows itself. A duplicate run is harmless anyway: the flush skips rows already Applied.
"""

import json
import time
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from runstate.defs.runs.liveness import HOLDING_STATUSES, RunLiveness, check_runs
from runstate.defs.tags import MAX_RUNTIME_TAG, WAL_BATCH_TAG, WAL_SHARD_TAG
from runstate.defs.wal.always_on import FLUSH_JOB, WAL_FLUSHER_TAG, hold_shard
from runstate.defs.wal.partitions import datasets_partitions
from runstate.defs.wal.resources import WalResource
from runstate.wal import read_stream
from runstate.wal.planning import plan_flush
from runstate.wal.shards import ShardPlan

SENSOR_INTERVAL_S = 5
CURSOR_VERSION = 1


@dataclass
class WalSensorCursor:
    """The sensor's durable position: the stream position of every shard (the core's cursor dict)."""

    stream: dict[str, Any] | None = None
    ticks: int = 0
    planned_rows: int = 0

    @classmethod
    def parse(cls, raw: str | None) -> "WalSensorCursor":
        """An absent or unreadable cursor restarts the stream; the Pending sweep still finds every row."""
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except ValueError:
            return cls()
        if not isinstance(data, dict) or data.get("v") != CURSOR_VERSION:
            return cls()
        return cls(
            stream=data.get("stream"),
            ticks=int(data.get("ticks", 0)),
            planned_rows=int(data.get("planned_rows", 0)),
        )

    def dump(self) -> str:
        payload = {
            "v": CURSOR_VERSION,
            "stream": self.stream,
            "ticks": self.ticks,
            "planned_rows": self.planned_rows,
        }
        return json.dumps(payload, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class BatchRuns:
    """What the instance knows about the runs of one plan."""

    dead: int  # FAILURE or CANCELED (a run found without a heartbeat is reported failed first)
    alive: int  # queued, starting or running, e.g. a daemon auto-retry of a failed run
    succeeded: int


def _count(verdicts: list[RunLiveness]) -> BatchRuns:
    dead = sum(1 for verdict in verdicts if verdict.dead)
    succeeded = sum(1 for verdict in verdicts if verdict.status == dg.DagsterRunStatus.SUCCESS)
    return BatchRuns(dead=dead, alive=len(verdicts) - dead - succeeded, succeeded=succeeded)


def batch_runs(instance: dg.DagsterInstance, plan_key: str) -> BatchRuns:
    records = instance.get_run_records(filters=dg.RunsFilter(tags={WAL_BATCH_TAG: plan_key}))
    return _count(check_runs(instance, records))


@dataclass(frozen=True)
class ShardRuns:
    holder: RunLiveness | None  # the shard's live flush run, if any
    last_requested: float | None  # epoch seconds of the newest flush run of the shard

    @property
    def alive(self) -> bool:
        return self.holder is not None


def shard_runs(instance: dg.DagsterInstance, shard: int) -> ShardRuns:
    """The shard's live run, of any job and whoever started it, its always-on run included (runs found
    dead are reported failed first), and when its latest flush run was requested."""
    tags = {WAL_SHARD_TAG: str(shard)}
    holding = [
        record
        for tag in (WAL_SHARD_TAG, WAL_FLUSHER_TAG)
        for record in instance.get_run_records(
            filters=dg.RunsFilter(tags={tag: str(shard)}, statuses=list(HOLDING_STATUSES))
        )
    ]
    latest = instance.get_run_records(filters=dg.RunsFilter(job_name=FLUSH_JOB, tags=tags), limit=1)
    last = latest[0].create_timestamp.timestamp() if latest else None
    live = [verdict for verdict in check_runs(instance, holding) if verdict.alive]
    return ShardRuns(holder=live[0] if live else None, last_requested=last)


def flush_run_request(plan: ShardPlan, generation: int, wal: WalResource) -> dg.RunRequest:
    tags = {WAL_SHARD_TAG: str(plan.shard), WAL_BATCH_TAG: plan.key}
    if wal.stale_run_seconds > 0:
        tags[MAX_RUNTIME_TAG] = str(wal.stale_run_seconds)
    batches = [{"dataset_id": batch.dataset_id, "seqs": list(batch.seqs)} for batch in plan.batches]
    return dg.RunRequest(
        job_name=FLUSH_JOB,
        run_key=f"{plan.key}-g{generation}",
        run_config={"ops": {"flush_wal_shard": {"config": {"shard": plan.shard, "batches": batches}}}},
        tags=tags,
    )


@dataclass
class TickPlan:
    requests: list[dg.RunRequest]
    new_datasets: list[str]
    cursor: WalSensorCursor
    batches: int
    holders: dict[int, RunLiveness] = field(default_factory=dict)  # shard -> its live flush run
    waiting: dict[int, float] = field(default_factory=dict)  # shard -> seconds since its last request

    @property
    def held(self) -> int:
        return len(self.holders)

    @property
    def skip_reason(self) -> str:
        reasons = [
            f"shard {shard} is held by {holder.describe()}" for shard, holder in sorted(self.holders.items())
        ]
        reasons += [
            f"shard {shard} got a run {age:.0f} s ago (at most one per run interval)"
            for shard, age in sorted(self.waiting.items())
        ]
        return "; ".join(reasons) or "no pending WAL rows"


def evaluate_wal_tick(
    instance: dg.DagsterInstance, cursor: WalSensorCursor, wal: WalResource, now: float | None = None
) -> TickPlan:
    """Read the stream, plan (runstate.wal.planning: the sweep, batches, shards), and turn each shard with
    work into at most one run request."""
    table = wal.wal_table()
    streamed, stream_cursor = read_stream(wal.streams_client(), table, cursor.stream)
    planned = plan_flush(table, max_batch_size=wal.max_batch_size, shards=wal.flush_shards, streamed=streamed)
    now = time.time() if now is None else now
    requests: list[dg.RunRequest] = []
    holders: dict[int, RunLiveness] = {}
    waiting: dict[int, float] = {}
    if wal.flush_always_on:  # every shard has its run, with or without work (runstate.defs.wal.always_on)
        by_shard = {plan.shard: plan for plan in planned.shards}
        for shard_no in range(wal.flush_shards):
            held = hold_shard(instance, wal, shard_no, by_shard.get(shard_no), now)
            requests += [held.request] if held.request else []
            holders.update({shard_no: held.holder} if held.holder else {})
    on_demand = () if wal.flush_always_on else planned.shards
    for plan in on_demand:
        shard = shard_runs(instance, plan.shard)
        if shard.holder is not None:  # it (or the daemon's retry of it) flushes; new rows wait for the next
            holders[plan.shard] = shard.holder
        elif shard.last_requested is not None and now - shard.last_requested < wal.min_run_interval_s:
            waiting[plan.shard] = now - shard.last_requested
        else:
            runs = batch_runs(instance, plan.key)
            requests.append(flush_run_request(plan, runs.dead + runs.succeeded, wal))
    known = set(instance.get_dynamic_partitions(datasets_partitions.name))
    new_datasets = sorted((planned.datasets | set(planned.applied)) - known)
    next_cursor = WalSensorCursor(
        stream=stream_cursor,
        ticks=cursor.ticks + 1,
        planned_rows=cursor.planned_rows + planned.rows,
    )
    return TickPlan(
        requests,
        new_datasets,
        next_cursor,
        batches=len(planned.batches),
        holders=holders,
        waiting=waiting,
    )


@dg.sensor(
    job_name=FLUSH_JOB,  # by name, so tests can bind a flush_wal built with a faster retry policy
    minimum_interval_seconds=SENSOR_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every 5 s: tail the WAL stream, sweep Pending rows, request at most one flush_wal run per "
    "flush shard with work (and at most one per shard per run interval).",
)
def wal_sensor(context: dg.SensorEvaluationContext, wal: WalResource) -> dg.SensorResult:
    plan = evaluate_wal_tick(context.instance, WalSensorCursor.parse(context.cursor), wal)
    partition_requests = (
        [datasets_partitions.build_add_request(plan.new_datasets)] if plan.new_datasets else []
    )
    return dg.SensorResult(
        run_requests=plan.requests,
        skip_reason=None if plan.requests else plan.skip_reason,
        cursor=plan.cursor.dump(),
        dynamic_partitions_requests=partition_requests,
    )
