"""`run_snapshots_sensor`: request the run_snapshots partitions (start days) of runs with new events.

A pure decision: it reads which runs are stale (events above their stored projection), maps each to
the UTC day it started, and yields one RunRequest per day. The run_key hashes the day's stale runs
and their last seqs, so a request that is still queued is not launched twice, and new events make a
new key. The runs of the store's bookkeeping jobs (BOOKKEEPING_JOBS) wait for another stale run of their
day, or for their day to be over: a day of bookkeeping runs alone (an idle deployment whose schedules are
off) is projected once, the next day, so such runs never pile up in the STALE_RUNS_PER_TICK window that
every tick reads (ordered by run id) and hide a run that has to be projected.
"""

import hashlib
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime

import dagster as dg

from runstate.defs.eventstore.assets import BOOKKEEPING_JOBS, RUN_START_DAYS, run_snapshots_job
from runstate.defs.eventstore.resources import EventStoreResource
from runstate.defs.tags import TABLE_TAG

STALE_RUNS_PER_TICK = 1000


def stale_days(stale: list[tuple[str, datetime | None, int]]) -> dict[str, list[tuple[str, int]]]:
    """Partition key (UTC day) -> the stale runs that started that day."""
    by_day: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for run_id, started_at, last_seq in stale:
        if started_at is None:
            continue
        by_day[started_at.astimezone(UTC).strftime("%Y-%m-%d")].append((run_id, last_seq))
    return by_day


def day_run_key(day: str, runs: list[tuple[str, int]]) -> str:
    digest = hashlib.sha256("\n".join(f"{run_id}|{seq}" for run_id, seq in sorted(runs)).encode()).hexdigest()
    return f"run_snapshots:{day}:{digest[:16]}"


def requested_days(
    stale: list[tuple[str, datetime | None, int]], own: set[str], *, today: str
) -> dict[str, list[tuple[str, int]]]:
    """The days to request, each with the runs its run_key is made of: the day's stale runs other than
    the bookkeeping runs `own`; for a day before `today` with bookkeeping runs alone, those."""
    requested = {}
    for day, runs in stale_days(stale).items():
        others = [run for run in runs if run[0] not in own]
        if others or day < today:
            requested[day] = others or runs
    return requested


def bookkeeping_runs(instance: dg.DagsterInstance, run_ids: list[str]) -> set[str]:
    """The runs among `run_ids` of the store's bookkeeping jobs (BOOKKEEPING_JOBS: projections and
    exports). They are projected with the next other run of their day."""
    if not run_ids:
        return set()
    runs = instance.get_runs(dg.RunsFilter(run_ids=run_ids))
    return {run.run_id for run in runs if run.job_name in BOOKKEEPING_JOBS}


@dg.sensor(
    job=run_snapshots_job,
    minimum_interval_seconds=60,
    description="Projects the runs with new events: requests the start-day partitions of stale runs.",
)
def run_snapshots_sensor(context: dg.SensorEvaluationContext, event_store: EventStoreResource) -> Iterator:
    store = event_store.get_store()
    stale = store.stale_runs_with_start(limit=STALE_RUNS_PER_TICK)
    own = bookkeeping_runs(context.instance, [run_id for run_id, _, _ in stale])
    by_day = requested_days(stale, own, today=datetime.now(UTC).strftime("%Y-%m-%d"))
    known_days = set(RUN_START_DAYS.get_partition_keys(dynamic_partitions_store=None))
    if not by_day:
        yield dg.SkipReason(
            f"no run has events newer than its projection but {len(own)} bookkeeping run(s)"
            if own
            else "no run has events newer than its projection"
        )
        return
    for day in sorted(by_day):
        if day not in known_days:
            context.log.warning(
                f"{len(by_day[day])} stale run(s) started on {day}, outside the partitions; skipped"
            )
            continue
        yield dg.RunRequest(
            run_key=day_run_key(day, by_day[day]),
            partition_key=day,
            tags={TABLE_TAG: "run_snapshots"},
        )
