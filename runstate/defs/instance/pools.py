"""The `runstate_spark` pool in the instance: its limit, and slots no live run holds.

A Dagster pool is bounded only once the instance has a limit for it: with none (and no `concurrency:
pools: default_limit` in dagster.yaml) Dagster lets every step of the pool run at once. So
`runstate db upgrade` and `runstate services up` set the limit to RUNSTATE_SPARK_SESSIONS through the
instance API (`runstate.commands.instance`, with `runstate.defs.pool`), and `spark_pool_sensor` sets it
in an instance where neither ran.

A slot is freed when its step ends, but a run whose process was killed holds its slots until someone
frees them: Dagster's run monitoring does that only when `free_slots_after_run_end_seconds` is set, and a
plain instance has no run monitoring. `spark_pool_sensor` judges every run that holds or waits for a slot
by its heartbeat (`runstate.defs.runs.liveness`: a dead one is reported failed) and frees the slots and
queue places of every run that has ended, so a killed Spark run never blocks the pool for good.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import dagster as dg

from runstate.config import settings
from runstate.defs.pool import set_pool_slots
from runstate.defs.tags import SPARK_POOL

if TYPE_CHECKING:
    from runstate.defs.runs.liveness import RunLiveness

SWEEP_INTERVAL_S = 15
ENDED_STATUSES = frozenset(
    {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
)


@dataclass
class PoolSweep:
    """One look at the pool: its limit, the runs holding or waiting for slots, what was set or freed."""

    limit: int | None
    limit_set: bool = False
    holders: list[RunLiveness] = field(default_factory=list)
    freed_runs: list[str] = field(default_factory=list)

    def describe(self) -> str:
        limit = "no limit" if self.limit is None else f"limit {self.limit}"
        parts = [
            f"{SPARK_POOL}: {limit}" + (" (set now from RUNSTATE_SPARK_SESSIONS)" if self.limit_set else "")
        ]
        alive = [holder for holder in self.holders if holder.alive]
        parts.append(
            f"{len(alive)} live run(s) holding or waiting for a slot"
            + (": " + "; ".join(holder.describe() for holder in alive) if alive else "")
        )
        if self.freed_runs:
            parts.append(
                f"freed the slots of {len(self.freed_runs)} ended run(s): {', '.join(self.freed_runs)}"
            )
        return "; ".join(parts)


def sweep_spark_pool(instance: dg.DagsterInstance, sessions: int) -> PoolSweep:
    """Set the pool's limit when the instance has none, and free the slots of runs that have ended."""
    # Imported here: every process that loads the instance imports this package for its storage class
    # (dagster.yaml names runstate.defs.instance.storage), and the runs domain imports the event store's
    # definitions and PySpark, a second of CPU in each webserver, daemon and `runstate services up`.
    from runstate.defs.runs.liveness import check_runs

    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return PoolSweep(limit=None)
    info = storage.get_concurrency_info(SPARK_POOL)
    sweep = PoolSweep(limit=info.limit)
    if info.limit is None:
        set_pool_slots(storage, SPARK_POOL, sessions)
        sweep.limit, sweep.limit_set = sessions, True
    run_ids = {slot.run_id for slot in info.claimed_slots} | {step.run_id for step in info.pending_steps}
    if not run_ids:
        return sweep
    records = instance.get_run_records(filters=dg.RunsFilter(run_ids=sorted(run_ids)))
    sweep.holders = check_runs(instance, records)
    ended = {holder.run_id for holder in sweep.holders if holder.status in ENDED_STATUSES}
    ended |= run_ids - {record.dagster_run.run_id for record in records}  # a deleted run holds nothing
    for run_id in sorted(ended):
        storage.free_concurrency_slots_for_run(run_id)
    sweep.freed_runs = sorted(ended)
    return sweep


@dg.sensor(
    name="spark_pool_sensor",
    minimum_interval_seconds=SWEEP_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=f"Keeps the Dagster pool {SPARK_POOL} bounded in any instance: sets its limit "
    "(RUNSTATE_SPARK_SESSIONS) when the instance has none, and frees the slots of runs that ended or died.",
)
def spark_pool_sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
    sweep = sweep_spark_pool(context.instance, settings().spark_sessions)
    if sweep.limit_set or sweep.freed_runs:
        context.log.warning(sweep.describe())
    return dg.SkipReason(sweep.describe())
