"""wal_sensor's side of always-on flush runs (`runstate.wal.holding`): every flush shard has one live run
that holds its lease; the sensor starts it, starts its successor when it asks for one, and takes the lease
from a holder found dead so its replacement holds the shard at once.

Always-on runs are tagged `runstate/wal_flusher` with their shard, not `runstate/wal_shard`: dagster.yaml's
limit of one run per `runstate/wal_shard` value would queue the successor behind its predecessor, which
only ends once the successor holds the shard. No tag limit keys on `runstate/wal_flusher`; the lease lets
one run flush, and this sensor requests one run per shard, plus one successor per lease generation.
A compaction (tagged `runstate/wal_shard`) runs beside the shard's flusher: both switch a dataset's
manifest only by conditional puts, and retry when the other moved it.
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg

from runstate.defs.runs.liveness import HOLDING_STATUSES, RunLiveness, check_runs
from runstate.defs.tags import MAX_RUNTIME_TAG, WAL_BATCH_TAG
from runstate.defs.wal.resources import WalResource
from runstate.wal.lease import LeaseState, ShardLease
from runstate.wal.shards import ShardPlan

FLUSH_JOB = "flush_wal"
WAL_FLUSHER_TAG = "runstate/wal_flusher"


def live_flushers(instance: dg.DagsterInstance, shard: int) -> list[RunLiveness]:
    """The shard's always-on runs in progress or queued, oldest first (runs found dead are reported
    failed on the way)."""
    records = instance.get_run_records(
        filters=dg.RunsFilter(tags={WAL_FLUSHER_TAG: str(shard)}, statuses=list(HOLDING_STATUSES))
    )
    verdicts = [verdict for verdict in check_runs(instance, records) if verdict.alive]
    return sorted(verdicts, key=lambda verdict: verdict.started_at or 0.0)


def _break_dead_holder(instance: dg.DagsterInstance, lease: ShardLease, state: LeaseState) -> bool:
    """A holder whose run has ended (or was just found dead and failed) loses the lease now. A holder
    that is no run of this instance (a test, another deployment) keeps it until it expires."""
    if not state.holder:
        return False
    run = instance.get_run_by_id(state.holder)
    if run is None or run.status in HOLDING_STATUSES:
        return False
    return lease.break_dead(state.holder)


@dataclass(frozen=True)
class HeldShard:
    """What the sensor decided for one shard: a run to request, or the run that holds it."""

    request: dg.RunRequest | None = None
    holder: RunLiveness | None = None


def held_run_request(shard: int, plan: ShardPlan | None, key: str, wal: WalResource) -> dg.RunRequest:
    tags = {WAL_FLUSHER_TAG: str(shard)}
    if plan is not None:
        tags[WAL_BATCH_TAG] = plan.key
    if wal.stale_run_seconds > 0:
        tags[MAX_RUNTIME_TAG] = str(wal.stale_run_seconds)
    batches = [
        {"dataset_id": batch.dataset_id, "seqs": list(batch.seqs)} for batch in (plan.batches if plan else ())
    ]
    config = {"shard": shard, "batches": batches, "hold": True}
    return dg.RunRequest(
        job_name=FLUSH_JOB,
        run_key=key,
        run_config={"ops": {"flush_wal_shard": {"config": config}}},
        tags=tags,
    )


def _requested_within(instance: dg.DagsterInstance, shard: int, seconds: float, now: float) -> bool:
    """Whether the shard's latest always-on run was requested less than `seconds` ago: a run that ends
    at once (a crash at its start, say) is not replaced every tick."""
    latest = instance.get_run_records(filters=dg.RunsFilter(tags={WAL_FLUSHER_TAG: str(shard)}), limit=1)
    return bool(latest) and now - latest[0].create_timestamp.timestamp() < seconds


def hold_shard(
    instance: dg.DagsterInstance, wal: WalResource, shard: int, plan: ShardPlan | None, now: float
) -> HeldShard:
    """A run for a shard without a live flusher (with the shard's plan, flushed first; at most one per
    run interval), or a successor for a holder that wants one; else the shard's holder (or nothing)."""
    lease = ShardLease(wal.wal_table(), shard, wal.flush_shards, ttl_s=wal.flush_lease_ttl_s)
    live = live_flushers(instance, shard)
    state = lease.read()
    if _break_dead_holder(instance, lease, state):
        state = lease.read()
    successor_wanted = len(live) == 1 and state.wanted and state.holder == live[0].run_id
    if live and not successor_wanted:
        return HeldShard(holder=live[0])
    if not live and _requested_within(instance, shard, wal.min_run_interval_s, now):
        return HeldShard()
    # Deterministic: a second look at the same state asks for the same run, which the daemon starts once.
    count = instance.get_runs_count(filters=dg.RunsFilter(tags={WAL_FLUSHER_TAG: str(shard)}))
    key = f"wal-shard{shard}-of{wal.flush_shards}-held-g{state.generation}-r{count}"
    if live:  # the successor: its predecessor flushes the shard's rows until the hand-over
        return HeldShard(request=held_run_request(shard, None, key, wal), holder=live[0])
    return HeldShard(request=held_run_request(shard, plan, key, wal))
