"""`wal_sensor`: the 30 s flush timer. It tails the WAL stream, sweeps the Pending index, plans batches
and requests one `flush_wal` run per batch.

Run keys and failures. The daemon never launches a run_key that already has a run, yet a batch whose
run failed must be flushed again once the fault clears. So a run_key is `<batch key>-g<generation>`:
the batch key is the core's deterministic key of (dataset, seqs), and the generation counts the runs of
that batch (found by the `runstate/wal_batch` tag) that are dead: FAILURE, CANCELED, or STARTED for
longer than `stale_run_seconds` (a worker killed outright never reports failure; Dagster's run
monitoring fails it at the same moment through the run's `dagster/max_runtime` tag). While a run of the
batch is alive (including the daemon's auto-retry of a failed run, which carries the same tags) the
tick requests nothing for it; once every run of it is dead the next tick requests generation + 1 (its
key is new, so the daemon launches it). A succeeded batch is not planned again while its rows stay
Applied; if the same seqs turn up Pending again (the WAL table was recreated under a kept Dagster
database), finished runs count towards the generation, so they are flushed too. A duplicate run is
harmless: the flush skips rows already Applied.
"""

import json
import time
from dataclasses import dataclass
from typing import Any

import dagster as dg

from runstate.defs.wal.partitions import BATCH_TAG, DATASET_TAG, MAX_RUNTIME_TAG, datasets_partitions
from runstate.defs.wal.resources import WalResource
from runstate.wal import Batch, last_applied_seqs, plan_batches, read_stream, sweep_pending

FLUSH_INTERVAL_S = 30
FLUSH_JOB = "flush_wal"
CURSOR_VERSION = 1
DEAD_STATUSES = {dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


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
        return cls(stream=data.get("stream"), ticks=int(data.get("ticks", 0)), planned_rows=int(data.get("planned_rows", 0)))

    def dump(self) -> str:
        payload = {"v": CURSOR_VERSION, "stream": self.stream, "ticks": self.ticks, "planned_rows": self.planned_rows}
        return json.dumps(payload, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class BatchRuns:
    """What the instance knows about the runs of one batch."""

    dead: int  # FAILURE, CANCELED, or STARTED longer than stale_run_seconds
    alive: int  # queued, starting or running (and not stale), e.g. a daemon auto-retry of a failed run
    succeeded: int


def batch_runs(instance: dg.DagsterInstance, batch_key: str, stale_run_seconds: float, now: float) -> BatchRuns:
    records = instance.get_run_records(filters=dg.RunsFilter(tags={BATCH_TAG: batch_key}))
    dead = sum(1 for record in records if _is_dead(record, stale_run_seconds, now))
    succeeded = sum(1 for record in records if record.dagster_run.status == dg.DagsterRunStatus.SUCCESS)
    return BatchRuns(dead=dead, alive=len(records) - dead - succeeded, succeeded=succeeded)


def _is_dead(record: Any, stale_run_seconds: float, now: float) -> bool:
    status = record.dagster_run.status
    if status in DEAD_STATUSES:
        return True
    started = record.start_time
    return status == dg.DagsterRunStatus.STARTED and started is not None and now - started >= stale_run_seconds


def flush_run_request(batch: Batch, generation: int, wal: WalResource) -> dg.RunRequest:
    tags = {DATASET_TAG: batch.dataset_id, BATCH_TAG: batch.run_key}
    if wal.stale_run_seconds > 0:
        tags[MAX_RUNTIME_TAG] = str(wal.stale_run_seconds)
    return dg.RunRequest(
        job_name=FLUSH_JOB,
        run_key=f"{batch.run_key}-g{generation}",
        run_config={"ops": {"flush_wal_batch": {"config": {"dataset_id": batch.dataset_id, "seqs": list(batch.seqs)}}}},
        tags=tags,
    )


@dataclass
class TickPlan:
    requests: list[dg.RunRequest]
    new_datasets: list[str]
    cursor: WalSensorCursor
    batches: int
    held: int  # batches left alone because a live run of theirs exists

    @property
    def skip_reason(self) -> str:
        if self.held:
            return f"{self.held} planned batch(es) already have a running flush"
        return "no pending WAL rows"


def evaluate_wal_tick(
    instance: dg.DagsterInstance, cursor: WalSensorCursor, wal: WalResource, now: float | None = None
) -> TickPlan:
    """Read stream + sweep, plan batches, and turn each batch without a live run into a run request."""
    dynamodb = wal.dynamodb_client()
    streamed, stream_cursor = read_stream(wal.streams_client(), dynamodb, wal.table_name, cursor.stream)
    # The sweep is what makes a lost cursor, a trimmed stream or a failed run harmless.
    swept = sweep_pending(dynamodb, wal.table_name)
    # Old stream records of rows applied since are dropped, so no run is requested for them. Swept rows are
    # kept even below LastAppliedSeq: such a row is a crash leftover that a flush repairs.
    # One query of the meta rows: every dataset's LastAppliedSeq, and the full list of datasets.
    applied = last_applied_seqs(dynamodb, wal.table_name)
    fresh = [key for key in streamed if key.seq_no > applied.get(key.dataset_id, 0)]
    batches = plan_batches([*fresh, *swept], max_batch_size=wal.max_batch_size)
    now = time.time() if now is None else now
    requests, held = [], 0
    for batch in batches:
        runs = batch_runs(instance, batch.run_key, wal.stale_run_seconds, now)
        # A live run of this batch (ours, or the daemon's auto-retry of a failed one) will apply it.
        if runs.alive:
            held += 1
            continue
        # A batch planned again after a run of it succeeded is a new incarnation of those seqs (the WAL
        # table was recreated, e.g. moto restarted beside a kept Dagster database): it needs a new key too.
        requests.append(flush_run_request(batch, runs.dead + runs.succeeded, wal))
    known = set(instance.get_dynamic_partitions(datasets_partitions.name))
    new_datasets = sorted(({b.dataset_id for b in batches} | set(applied)) - known)
    next_cursor = WalSensorCursor(
        stream=stream_cursor, ticks=cursor.ticks + 1, planned_rows=cursor.planned_rows + sum(len(b.seqs) for b in batches)
    )
    return TickPlan(requests, new_datasets, next_cursor, batches=len(batches), held=held)


@dg.sensor(
    job_name=FLUSH_JOB,  # by name, so tests can bind a flush_wal built with a faster retry policy
    minimum_interval_seconds=FLUSH_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every 30 s: tail the WAL stream, sweep Pending rows, request one flush_wal run per batch.",
)
def wal_sensor(context: dg.SensorEvaluationContext, wal: WalResource) -> dg.SensorResult:
    plan = evaluate_wal_tick(context.instance, WalSensorCursor.parse(context.cursor), wal)
    partition_requests = [datasets_partitions.build_add_request(plan.new_datasets)] if plan.new_datasets else []
    if not plan.requests:
        return dg.SensorResult(skip_reason=plan.skip_reason, cursor=plan.cursor.dump(), dynamic_partitions_requests=partition_requests)
    return dg.SensorResult(run_requests=plan.requests, cursor=plan.cursor.dump(), dynamic_partitions_requests=partition_requests)
