"""`runstate wal flush [--dataset X]`: flush now, in-process, fenced against a live run of the shard."""

from __future__ import annotations

import json
from collections.abc import Iterator

import dagster as dg
import pytest
from click.testing import CliRunner

from runstate.cli import main
from runstate.config import settings
from runstate.defs.runs.beats import beat
from runstate.defs.tags import WAL_SHARD_TAG
from runstate.defs.ticking import default_defs
from runstate.wal.shards import shard_of
from runstate_tests.wal.shell import WalWorld


@pytest.fixture
def cli(world: WalWorld, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    """The CLI pointed at the test's moto table/bucket and a Dagster home of its own."""
    monkeypatch.setenv("RUNSTATE_AWS_ENDPOINT_URL", world.endpoint)
    monkeypatch.setenv("RUNSTATE_WAL_TABLE", world.table)
    monkeypatch.setenv("RUNSTATE_BLOB_BUCKET", world.bucket)
    monkeypatch.setenv("RUNSTATE_BLOB_PREFIX", world.prefix)
    monkeypatch.setenv("DAGSTER_HOME", str(world.home))
    settings.cache_clear()
    yield CliRunner()
    settings.cache_clear()


def wal(cli: CliRunner, *args: str) -> tuple[int, str]:
    result = cli.invoke(main, ["wal", *args])
    return result.exit_code, result.output


def test_flush_applies_one_dataset_now_and_a_second_flush_finds_nothing(cli: CliRunner, world: WalWorld):
    for i in range(3):
        world.append("orders", f"k{i}", i)
    world.append("users", "u", 1)

    code, flushed = wal(cli, "flush", "--dataset", "orders")
    again_code, again = wal(cli, "flush", "--dataset", "orders")

    assert code == 0, flushed
    assert "orders: 3 row(s) applied, version 3" in flushed
    assert (again_code, again.strip()) == (0, "nothing to flush: no Pending rows for 'orders'")
    assert json.loads(wal(cli, "read", "--dataset", "orders")[1])["version"] == 3
    assert set(world.statuses("users").values()) == {"Pending"}  # only the dataset asked for


def test_a_shard_held_by_a_live_run_is_reported_with_its_run_and_nothing_is_flushed(
    cli: CliRunner, world: WalWorld
):
    world.append("orders", "a", 1)
    shard = shard_of("orders", default_defs().resources["wal"].flush_shards)
    with dg.DagsterInstance.get() as instance:
        holder = instance.create_run_for_job(
            default_defs().resolve_job_def("flush_wal"),
            tags={WAL_SHARD_TAG: str(shard)},
            run_config={"ops": {"flush_wal_shard": {"config": {"shard": shard, "batches": []}}}},
        )
        instance.handle_run_event(
            holder.run_id, dg.DagsterEvent(dg.DagsterEventType.RUN_START.value, job_name=holder.job_name)
        )
        beat(instance, holder.run_id)  # its worker beat just now: alive

        code, output = wal(cli, "flush", "--wait", "0")

    assert code == 1
    assert f"shard {shard} is held by run {holder.run_id}" in output and "heartbeat" in output
    assert set(world.statuses("orders").values()) == {"Pending"}


def test_flush_refuses_a_bad_dataset_id_before_reading_anything(cli: CliRunner):
    code, output = wal(cli, "flush", "--dataset", "bad id\n")

    assert code == 1 and output.startswith("Error:")
