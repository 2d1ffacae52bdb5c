"""Merge now (`runstate wal merge [--dataset X] [--rebuild]`): dataset tables brought up to their datasets'
versions on Spark, in-process.

Without a dataset it is one tick of `dataset_tables_sensor` (the datasets flushed since their last merge,
one run per merge shard). With one, it plans that dataset with the sensor's planner
(`runstate.wal.planning.plan_merges`) and executes one `merge_dataset_tables` run from the sensor's
`merge_run_request`, tagged with its merge shard, so the sensor holds the shard while it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import dagster as dg
from botocore.exceptions import BotoCoreError, ClientError

from runstate import wiring
from runstate.commands.instance import default_instance
from runstate.commands.ticking import TickResult, default_defs, execute_run, tick_sensor
from runstate.defs.dataset_tables.jobs import MERGE_JOB, MERGE_OP
from runstate.defs.dataset_tables.sensors import MERGE_SHARDS, merge_run_request
from runstate.wal.dataset_tables import DatasetTableError
from runstate.wal.planning import flushed_version, plan_merges

SENSOR_NAME = "dataset_tables_sensor"


@dataclass(frozen=True)
class MergeRun:
    """One merge run: one line per dataset it merged or found current, and what failed, if it did."""

    run_id: str
    success: bool
    lines: list[str]
    failure: str | None = None


@dataclass
class MergeReport:
    runs: list[MergeRun] = field(default_factory=list)
    skip_reason: str | None = None  # the sensor's, when it requested nothing

    @property
    def failed(self) -> list[MergeRun]:
        return [run for run in self.runs if not run.success]


def merge_now(dataset_id: str | None = None, rebuild: bool = False) -> MergeReport:
    """Every dataset flushed since its last merge (a sensor tick), or `dataset_id` alone (`rebuild`: from
    its snapshot and every delta)."""
    if rebuild and dataset_id is None:
        raise ValueError("a rebuild needs a dataset")
    if dataset_id is None:
        tick = _tick()
        report = MergeReport(skip_reason=tick.skip_reason if not tick.requested else None)
        results = tick.results
    else:
        report, results = MergeReport(), [_merge_one(default_defs(), dataset_id, rebuild)]
    report.runs = [
        MergeRun(run.run_id, run.success, _dataset_lines(run), None if run.success else _failure(run))
        for run in results
    ]
    return report


def _tick() -> TickResult:
    """The sensor's tick; a WAL table it cannot read is one DatasetTableError, not a traceback."""
    try:
        return tick_sensor(SENSOR_NAME)
    except dg.DagsterUserCodeExecutionError as error:
        cause = error.user_exception
        if isinstance(cause, (ClientError, BotoCoreError)):
            raise DatasetTableError(f"{SENSOR_NAME} could not read the WAL table: {cause}") from None
        raise
    except (ClientError, BotoCoreError) as error:
        raise DatasetTableError(f"{SENSOR_NAME} could not read the WAL table: {error}") from None


def _merge_one(defs: dg.Definitions, dataset_id: str, rebuild: bool) -> dg.ExecuteInProcessResult:
    # Refused (WalInputError) before anything runs: a bad id, a dataset without rows or nothing flushed.
    version = flushed_version(wiring.wal_table(), dataset_id)
    ((shard, versions),) = plan_merges({dataset_id: version}, requested={}, shards=MERGE_SHARDS).items()
    request = merge_run_request(shard, list(versions), tick=0, rebuild=rebuild)
    return execute_run(
        defs.resolve_job_def(MERGE_JOB), default_instance(), run_config=request.run_config, tags=request.tags
    )


def _dataset_lines(run: dg.ExecuteInProcessResult) -> list[str]:
    """One line per dataset the run merged (materialized) or found current (observed), in dataset order;
    a dataset merged by an earlier attempt of a retried step keeps its merge line."""
    lines: dict[str, str] = {}
    for observation in run.asset_observations_for_node(MERGE_OP):
        metadata = observation.metadata
        lines[observation.partition] = (
            f"{observation.partition}: {metadata['table'].value} at version {metadata['version'].value} "
            "(already current)"
        )
    for materialization in run.asset_materializations_for_node(MERGE_OP):
        metadata = materialization.metadata
        lines[materialization.partition] = (
            f"{materialization.partition}: {metadata['table'].value} at version {metadata['version'].value}"
        )
    return [lines[dataset_id] for dataset_id in sorted(lines)]


def _failure(run: dg.ExecuteInProcessResult) -> str:
    """What failed: the op's own description (which names each dataset's error), else the innermost
    error (Dagster reports a step that used up its retries as "Exceeded max_retries", the cause inside)."""
    for event in run.all_events:
        if not event.is_step_failure:
            continue
        data = event.step_failure_data
        if data.user_failure_data and data.user_failure_data.description:
            return " ".join(data.user_failure_data.description.split())
        error = data.error
        while error is not None and error.cause is not None:
            error = error.cause
        if error is not None:
            return " ".join(error.message.split())
    return "see the run's logs"
