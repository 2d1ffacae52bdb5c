"""flush_wal's linger: a run flushes its shard's rows that arrive while it runs, and only when asked to;
how the setting travels from the environment to the deployment's runs (never to in-process ones)."""

from __future__ import annotations

import dagster as dg
import pytest

from runstate.commands.ticking import tick_sensor
from runstate.config import settings
from runstate.defs.location import build_definitions
from runstate.defs.resources import wal_resource
from runstate.defs.wal.resources import WalResource
from runstate.wal import Change, DatasetReader, WalProducer
from runstate.wal.shards import shard_of
from runstate_tests.wal.shell import WalWorld

# late key -> the dataset whose row is appended once the run has stored its first blob.
LATE_ROWS: dict[str, str] = {}


class LateRowWalResource(WalResource):
    """The real resource; after the run's first PutObject, a row of another dataset is appended, so it
    arrives while the run is still flushing its plan (the plan cannot hold it)."""

    late_key: str

    def s3_client(self):
        client = super().s3_client()
        if not getattr(client, "_late_row_hook", False):
            client.meta.events.register("after-call.s3.PutObject", lambda **_: self._append_late_row())
            client._late_row_hook = True
        return client

    def _append_late_row(self) -> None:
        dataset = LATE_ROWS.pop(self.late_key, None)
        if dataset:
            WalProducer(self.dynamodb_client(), self.table).append(dataset, [Change.upsert("late", 1)])


def flush_with_a_late_row(world: WalWorld, instance: dg.DagsterInstance, linger_s: float, key: str):
    planned = "orders"
    late = next(f"late{i}" for i in range(100) if shard_of(f"late{i}", 2) == shard_of(planned, 2))
    world.append(planned, "a", 1)
    LATE_ROWS[key] = late
    resource = world.resource(LateRowWalResource, late_key=key, flush_linger_s=linger_s)
    tick = tick_sensor("wal_sensor", defs=world.defs(resource), instance=instance)
    return tick, planned, late


def test_a_lingering_run_flushes_a_row_that_arrives_while_it_runs(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    tick, planned, late = flush_with_a_late_row(world, instance, linger_s=1.0, key="linger")

    [run] = tick.results
    assert run.success
    materialized = sorted(m.partition for m in run.asset_materializations_for_node("flush_wal_shard"))
    assert materialized == sorted([planned, late])
    for dataset, state in ((planned, {"a": 1}), (late, {"late": 1})):
        assert DatasetReader(world.s3, world.bucket, world.prefix, dataset).read() == (1, state)
    assert world.statuses(late)[1].startswith("Applied")


def test_without_linger_the_late_row_waits_for_the_next_run(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    tick, planned, late = flush_with_a_late_row(world, instance, linger_s=0, key="no-linger")

    assert tick.succeeded == 1
    assert DatasetReader(world.s3, world.bucket, world.prefix, planned).version == 1
    assert DatasetReader(world.s3, world.bucket, world.prefix, late).version == 0
    assert world.statuses(late) == {1: "Pending"}


def test_a_budget_that_could_outlive_the_stale_run_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="under half of stale_run_seconds"):
        WalResource(flush_linger_s=20, flush_run_budget_s=500, stale_run_seconds=900)
    assert WalResource(flush_linger_s=20, flush_run_budget_s=240, stale_run_seconds=900).flush_linger_s == 20


def test_the_deployment_lingers_as_configured_and_in_process_runs_never_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RUNSTATE_WAL_FLUSH_LINGER_S", "7.5")
    settings.cache_clear()
    try:
        assert wal_resource().flush_linger_s == 7.5
        in_process = build_definitions(in_process_runs=True)
        with dg.build_resources({"wal": in_process.resources["wal"]}) as built:
            assert built.wal.flush_linger_s == 0
        monkeypatch.setenv("RUNSTATE_WAL_FLUSH_LINGER_S", "soon")
        settings.cache_clear()
        with pytest.raises(ValueError, match="RUNSTATE_WAL_FLUSH_LINGER_S must be a number of seconds"):
            wal_resource()
    finally:
        settings.cache_clear()
