"""`runstate wal flush [--dataset X]`: flush Pending WAL rows now, in-process, fenced per shard.

The command is `runstate.commands.flush.flush_now` (its docstring says how a shard is fenced against
other flushes); this verb prints each shard's report, the problems last, on stderr, and exits 1 when
there was one.
"""

from __future__ import annotations

import click


@click.command()
@click.option("--dataset", "dataset_id", default=None, help="Flush only this dataset (default: every one).")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(0, 600),
    default=30.0,
    show_default=True,
    help="Seconds to wait for another flush of the same shard (a run or a command) to end.",
)
def flush(dataset_id: str | None, wait_s: float) -> None:
    """Flush Pending WAL rows now, in-process (one flush_wal run per shard with work)."""
    from runstate.commands.flush import flush_now

    reports, problems = 0, []
    try:
        for report in flush_now(dataset_id, wait_s):
            reports += 1
            for line in report.lines:
                click.echo(line)
            if report.problem:
                problems.append(report.problem)
    finally:
        for problem in problems:
            click.echo(problem, err=True)
    if not reports:
        click.echo("nothing to flush: no Pending rows" + (f" for {dataset_id!r}" if dataset_id else ""))
    if problems:
        raise SystemExit(1)


def install(wal: click.Group) -> None:
    wal.add_command(flush)
