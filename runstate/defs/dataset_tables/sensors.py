"""`dataset_tables_sensor`: after flushes, request merge runs, a bounded number of them.

Every minute it reads each dataset's LastAppliedSeq (one DynamoDB query of the meta rows; no Spark)
and compares it with the version it last requested a merge for (its cursor). The datasets that moved
are grouped by merge shard (a stable hash of the dataset id), and each shard gets at most one run:
many deltas go into one merge, a dataset is merged at most once per tick, and never more than
MERGE_SHARDS merge runs (and JVMs) exist at once, however many datasets there are.

Failures: while any run tagged with a shard is alive (queued, launching, running or canceling, this
sensor's or the CLI's `wal merge`) the shard is held and its datasets wait, in any instance, with or
without the tag limits of this project's dagster.yaml. When a run of the shard is dead (failed,
canceled, or in progress without a heartbeat: `runstate.defs.runs.liveness` reports it failed), its
datasets are requested again; merge runs opt out of run retries, so this request is the one retry. A
lost cursor only requests every dataset once more, and a merge of a table that is already current
writes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from runstate.defs.dataset_tables.jobs import MERGE_JOB, MERGE_OP
from runstate.defs.runs.liveness import HOLDING_STATUSES, RunLiveness, check_runs
from runstate.defs.tags import MERGE_SHARD_TAG
from runstate.defs.wal.resources import WalResource
from runstate.wal import last_applied_seqs
from runstate.wal.planning import plan_merges

MERGE_SHARDS = 4
CURSOR_VERSION = 1


@dataclass
class MergeCursor:
    """The version each dataset's last requested merge was for, and a tick counter for run keys."""

    requested: dict[str, int] = field(default_factory=dict)
    ticks: int = 0

    @classmethod
    def parse(cls, raw: str | None) -> MergeCursor:
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = None
        if not isinstance(data, dict) or data.get("v") != CURSOR_VERSION:
            return cls()
        return cls({str(k): int(v) for k, v in data.get("requested", {}).items()}, int(data.get("ticks", 0)))

    def dump(self) -> str:
        return json.dumps(
            {"v": CURSOR_VERSION, "requested": self.requested, "ticks": self.ticks},
            sort_keys=True,
            separators=(",", ":"),
        )


@dataclass
class MergeTick:
    requests: list[dg.RunRequest]
    cursor: MergeCursor
    holders: dict[int, RunLiveness] = field(default_factory=dict)  # shard -> its live merge run

    @property
    def held_shards(self) -> list[int]:
        return sorted(self.holders)

    @property
    def skip_reason(self) -> str:
        if self.holders:
            return "; ".join(
                f"merge shard {shard} is held by {holder.describe()}"
                for shard, holder in sorted(self.holders.items())
            )
        return "every dataset table is at its dataset's version"


@dataclass(frozen=True)
class ShardRuns:
    holder: RunLiveness | None  # a live run of the shard, if any
    dead: list[Any]  # runs of the shard found dead: those that held it, and its latest run if dead


def shard_runs(instance: dg.DagsterInstance, shard: int) -> ShardRuns:
    """The shard's live run and its dead ones (runs found dead are reported failed first)."""
    tags = {MERGE_SHARD_TAG: str(shard)}
    holding = list(
        instance.get_run_records(filters=dg.RunsFilter(tags=tags, statuses=list(HOLDING_STATUSES)))
    )
    latest = [
        record
        for record in instance.get_run_records(filters=dg.RunsFilter(tags=tags), limit=1)
        if record.dagster_run.run_id not in {r.dagster_run.run_id for r in holding}
    ]
    records = holding + latest
    verdicts = check_runs(instance, records)
    alive = [verdict for verdict in verdicts if verdict.alive]
    dead = [record.dagster_run for record, verdict in zip(records, verdicts) if verdict.dead]
    return ShardRuns(alive[0] if alive else None, dead)


def _run_datasets(run: Any) -> list[str]:
    config = (run.run_config or {}).get("ops", {}).get(MERGE_OP, {}).get("config", {})
    return list(config.get("dataset_ids", []))


def merge_run_request(shard: int, dataset_ids: list[str], tick: int, rebuild: bool = False) -> dg.RunRequest:
    """The run of one merge shard (`rebuild`: `runstate wal merge --rebuild`'s, never the sensor's)."""
    config: dict[str, object] = {"dataset_ids": sorted(dataset_ids)}
    if rebuild:
        config["rebuild"] = True
    return dg.RunRequest(
        job_name=MERGE_JOB,
        run_key=f"merge-s{shard}-t{tick}",
        run_config={"ops": {MERGE_OP: {"config": config}}},
        tags={MERGE_SHARD_TAG: str(shard)},
    )


def evaluate_merge_tick(
    instance: dg.DagsterInstance, cursor: MergeCursor, wal: WalResource, shards: int = MERGE_SHARDS
) -> MergeTick:
    """Which shards get a merge run now, and the cursor after it (a pure decision: no claim, no write)."""
    requested = dict(cursor.requested)
    holders: dict[int, RunLiveness] = {}
    for shard in range(shards):
        runs = shard_runs(instance, shard)
        if runs.holder is not None:
            holders[shard] = runs.holder
        for run in runs.dead:
            for dataset_id in _run_datasets(run):
                requested.pop(dataset_id, None)
    due = plan_merges(last_applied_seqs(wal.wal_table()), requested, shards, held=holders)
    tick = cursor.ticks + 1
    requests = [merge_run_request(shard, list(versions), tick) for shard, versions in due.items()]
    for versions in due.values():
        requested.update(versions)
    return MergeTick(requests, MergeCursor(requested, tick), holders)


def build_dataset_tables_sensor(interval_s: int) -> dg.SensorDefinition:
    """dataset_tables_sensor, ticking every `interval_s` (RUNSTATE_DATASET_MERGE_INTERVAL_S)."""

    @dg.sensor(
        name="dataset_tables_sensor",
        job_name=MERGE_JOB,
        minimum_interval_seconds=interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Every {interval_s} s: datasets flushed since their last merge get one merge_dataset_tables "
        "run per merge shard (runstate/merge_shard tag), at most one live run per shard.",
    )
    def dataset_tables_sensor(context: dg.SensorEvaluationContext, wal: WalResource) -> dg.SensorResult:
        plan = evaluate_merge_tick(context.instance, MergeCursor.parse(context.cursor), wal)
        if not plan.requests:
            return dg.SensorResult(skip_reason=plan.skip_reason, cursor=plan.cursor.dump())
        return dg.SensorResult(run_requests=plan.requests, cursor=plan.cursor.dump())

    return dataset_tables_sensor
