"""wal_sensor with always-on flush runs: one held run per shard (with the shard's plan), a successor only
when the holder asks, a dead holder's lease taken at once; and flush_wal holding a shard for real."""

from __future__ import annotations

import threading
import time

import dagster as dg
import pytest

from runstate.commands.ticking import tick_sensor
from runstate.defs.tags import WAL_SHARD_TAG
from runstate.defs.wal.always_on import WAL_FLUSHER_TAG
from runstate.defs.wal.resources import WalResource
from runstate.defs.wal.sensors import WalSensorCursor, evaluate_wal_tick
from runstate.wal import DatasetReader
from runstate.wal.lease import ShardLease
from runstate.wal.shards import shard_of
from runstate_tests.support.runs import started_run
from runstate_tests.wal.shell import WalWorld

# A run the instance reads as flush_wal's, with no process behind it (its liveness is its first sighting).
FLUSH_RUN = dg.JobDefinition(name="flush_wal", graph_def=dg.GraphDefinition("g"))
ALWAYS_ON = dict(flush_always_on=True, flush_poll_s=0.1, flush_lease_ttl_s=10)


def dataset_in(shard: int, prefix: str = "ds") -> str:
    return next(name for name in (f"{prefix}{i}" for i in range(1000)) if shard_of(name, 2) == shard)


def config_of(request: dg.RunRequest) -> dict:
    return request.run_config["ops"]["flush_wal_shard"]["config"]


def lease(world: WalWorld, resource: WalResource, shard: int) -> ShardLease:
    return ShardLease(resource.wal_table(), shard, 2, ttl_s=10)


def test_every_shard_gets_one_held_run_and_a_shard_with_rows_gets_its_plan(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    dataset = dataset_in(0)
    world.append(dataset, "a", 1)
    resource = world.resource(**ALWAYS_ON)

    first = evaluate_wal_tick(instance, WalSensorCursor(), resource)
    again = evaluate_wal_tick(instance, WalSensorCursor(), resource)

    assert [config_of(r)["shard"] for r in first.requests] == [0, 1]
    assert all(config_of(r)["hold"] for r in first.requests)
    assert config_of(first.requests[0])["batches"] == [{"dataset_id": dataset, "seqs": [1]}]
    assert config_of(first.requests[1])["batches"] == []
    assert [r.tags[WAL_FLUSHER_TAG] for r in first.requests] == ["0", "1"]
    assert not any(WAL_SHARD_TAG in r.tags for r in first.requests)  # its successor must not queue behind it
    assert [r.run_key for r in again.requests] == [r.run_key for r in first.requests]


def test_a_live_holder_keeps_its_shard_until_it_wants_a_successor(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    resource = world.resource(**ALWAYS_ON)
    run = started_run(instance, FLUSH_RUN, tags={WAL_FLUSHER_TAG: "0"})
    held = lease(world, resource, 0).acquire(run.run_id)

    quiet = evaluate_wal_tick(instance, WalSensorCursor(), resource)
    lease(world, resource, 0).want_successor(held)
    wanted = evaluate_wal_tick(instance, WalSensorCursor(), resource)

    assert [config_of(r)["shard"] for r in quiet.requests] == [1] and quiet.holders[0].run_id == run.run_id
    successor = next(r for r in wanted.requests if config_of(r)["shard"] == 0)
    assert config_of(successor)["hold"] and config_of(successor)["batches"] == []


def test_a_holder_whose_run_died_loses_its_lease_and_is_replaced_at_once(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    resource = world.resource(**ALWAYS_ON)
    run = started_run(instance, FLUSH_RUN, tags={WAL_FLUSHER_TAG: "0"})
    lease(world, resource, 0).acquire(run.run_id)
    instance.report_run_failed(run)

    tick = evaluate_wal_tick(instance, WalSensorCursor(), resource)

    assert [config_of(r)["shard"] for r in tick.requests] == [0, 1]
    state = lease(world, resource, 0).read()
    assert state.holder == "" and state.generation == 1  # free: the replacement takes generation 2


def test_a_held_run_flushes_its_plan_and_the_rows_that_come_while_it_holds_the_shard(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    planned, late = dataset_in(0), dataset_in(0, "late")
    world.append(planned, "a", 1)
    resource = world.resource(**ALWAYS_ON, flush_run_budget_s=3.0, flush_handover_wait_s=0.5)
    timer = threading.Timer(1.0, lambda: world.append(late, "b", 2))
    timer.start()
    started = time.monotonic()

    tick = tick_sensor("wal_sensor", defs=world.defs(resource), instance=instance)

    timer.join()
    assert tick.succeeded == 2 and time.monotonic() - started >= 2 * 3.0
    for dataset, state in ((planned, {"a": 1}), (late, {"b": 2})):
        assert DatasetReader(world.s3, world.bucket, world.prefix, dataset).read() == (1, state)
    assert lease(world, resource, 0).read().holder == ""  # no successor came: it let the shard go


@pytest.mark.parametrize("budget,wait", [(300.0, 200.0), (400.0, 60.0)])
def test_an_always_on_run_that_could_outlive_the_stale_run_limit_is_refused(budget, wait) -> None:
    with pytest.raises(ValueError, match="flush_handover_wait_s"):
        WalResource(
            flush_always_on=True, flush_run_budget_s=budget, flush_handover_wait_s=wait, stale_run_seconds=900
        )


def test_a_shard_whose_run_just_ended_waits_for_the_run_interval(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    resource = world.resource(**{**ALWAYS_ON, "min_run_interval_s": 60})
    run = started_run(instance, FLUSH_RUN, tags={WAL_FLUSHER_TAG: "0"})
    instance.report_run_failed(run)  # e.g. it crashed as it started

    soon = evaluate_wal_tick(instance, WalSensorCursor(), resource)
    later = evaluate_wal_tick(instance, WalSensorCursor(), resource, now=time.time() + 61)

    assert [config_of(r)["shard"] for r in soon.requests] == [1]
    assert [config_of(r)["shard"] for r in later.requests] == [0, 1]
