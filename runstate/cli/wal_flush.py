"""`runstate wal flush [--dataset X]`: flush Pending WAL rows now, in-process, fenced against shard runs.

`wal tick` asks the sensor, which may skip a shard flushed less than its run interval ago; this verb
does not wait for the timer. It plans the Pending rows as the sensor would, and runs `flush_wal` in this
process as one run per shard with work, tagged with its shard like the daemon's: while it runs, the
sensor sees the shard held and starts no other flush of it. A shard already held by a live run (its
heartbeat is fresh) is waited for, briefly; if it is still held then, it is reported with its run and
left to that run, which flushes its shard's new rows itself. A run that races this one past the check
is harmless: a flush applies each row once (the manifest's conditional put is the fence).
"""

from __future__ import annotations

import time
from typing import Any

import click

POLL_S = 1.0


def _pending_keys(wal: Any, dataset_id: str | None) -> list[Any]:
    """One dataset's rows after its LastAppliedSeq (read from the table, not the lagging index), or
    every Pending row."""
    from runstate.wal import WalKey
    from runstate.wal.changes import validate_dataset_id

    table = wal.wal_table()
    if dataset_id is None:
        return [WalKey(row.dataset_id, row.seq) for row in table.pending()]
    validate_dataset_id(dataset_id)
    applied = table.meta(dataset_id).last_applied_seq
    return [WalKey(dataset_id, seq) for seq in range(applied + 1, table.max_seq(dataset_id) + 1)]


def _wait_for_shard(instance: Any, shard: int, wait_s: float) -> Any:
    """The shard's live flush run after waiting up to `wait_s` for it to end, or None once it is free."""
    from runstate.defs.wal.sensors import shard_runs

    deadline = time.monotonic() + wait_s
    while True:
        holder = shard_runs(instance, shard).holder
        if holder is None or time.monotonic() >= deadline:
            return holder
        time.sleep(POLL_S)


@click.command()
@click.option("--dataset", "dataset_id", default=None, help="Flush only this dataset (default: every one).")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(0, 600),
    default=30.0,
    show_default=True,
    help="Seconds to wait for a live flush run of the same shard to end.",
)
def flush(dataset_id: str | None, wait_s: float) -> None:
    """Flush Pending WAL rows now, in-process (one flush_wal run per shard with work)."""
    from runstate.defs.ticking import default_defs, default_instance, execute_run
    from runstate.defs.wal.sensors import FLUSH_JOB, batch_runs, flush_run_request
    from runstate.wal import plan_batches
    from runstate.wal.shards import plan_shards

    defs = default_defs()
    wal = defs.resources["wal"]
    keys = _pending_keys(wal, dataset_id)
    plans = plan_shards(plan_batches(keys, max_batch_size=wal.max_batch_size), wal.flush_shards)
    if not plans:
        click.echo("nothing to flush: no Pending rows" + (f" for {dataset_id!r}" if dataset_id else ""))
        return
    instance, job, problems = default_instance(), defs.resolve_job_def(FLUSH_JOB), []
    for plan in plans:
        holder = _wait_for_shard(instance, plan.shard, wait_s)
        if holder is not None:
            problems.append(f"shard {plan.shard} is held by {holder.describe()}: that run flushes its rows")
            continue
        runs = batch_runs(instance, plan.key)
        request = flush_run_request(plan, runs.dead + runs.succeeded, wal)
        result = execute_run(job, instance, run_config=request.run_config, tags=request.tags)
        for event in result.asset_materializations_for_node("flush_wal_shard"):
            version = event.metadata["version"].value
            click.echo(f"{event.partition}: {event.metadata['rows'].value} row(s) applied, version {version}")
        flushed = result.output_for_node("flush_wal_shard") if result.success else None
        if flushed is None:
            problems.append(f"shard {plan.shard}: run {result.run_id} FAILED")
        elif flushed < len(plan.datasets):
            problems.append(f"shard {plan.shard}: run {result.run_id} left datasets unflushed (see its logs)")
    for problem in problems:
        click.echo(problem, err=True)
    if problems:
        raise SystemExit(1)


def install(wal: click.Group) -> None:
    wal.add_command(flush)
