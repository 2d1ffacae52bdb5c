"""`runstate services up|down|status`: the embedded dev services (Postgres, moto, fakesnow)."""

from __future__ import annotations

import sys

import click


@click.group()
def services() -> None:
    """Start, stop and inspect the embedded dev services; endpoints go to the project's .env."""


@services.command()
@click.option(
    "--pg-port", type=int, default=None, help="Port for an embedded Postgres cluster (default: a free one)."
)
@click.option("--moto-port", type=int, default=None, help="Port for moto_server (default: a free one).")
@click.option(
    "--fakesnow-port", type=int, default=None, help="Port for the fakesnow server (default: a free one)."
)
@click.option(
    "--embedded-pg", is_flag=True, help="initdb a cluster under .runstate/pg even when 5432 answers."
)
@click.option(
    "--spark-workers",
    type=click.IntRange(min=0),
    default=None,
    callback=lambda _ctx, _param, value: _within_the_machine(value),
    help="Also run a standalone Spark cluster of N workers on loopback and point RUNSTATE_SPARK_MASTER "
    "at it (0 stops it; default: keep what runs; without one, Spark runs local[2]). At most one worker "
    "per core and per 2.5 GiB of memory.",
)
def up(
    pg_port: int | None,
    moto_port: int | None,
    fakesnow_port: int | None,
    embedded_pg: bool,
    spark_workers: int | None,
) -> None:
    """Start (or reuse) Postgres, moto and fakesnow (and a Spark cluster); create databases; apply migrations;
    set the Dagster pool runstate_spark's limit (RUNSTATE_SPARK_SESSIONS)."""
    from runstate import services as svc  # here, not at import: the other verbs need no Postgres driver

    report = svc.up(
        pg_port=pg_port,
        moto_port=moto_port,
        fakesnow_port=fakesnow_port,
        embedded_pg=embedded_pg,
        spark_workers=spark_workers,
        log=click.echo,
    )
    from runstate.commands.instance import limit_spark_pool_at

    click.echo(f"endpoints written to {report.env_path}")
    click.echo(limit_spark_pool_at(report.env["DAGSTER_PG_URL"]))


def _within_the_machine(workers: int | None) -> int | None:
    """Refused before anything starts: `up` starts Postgres, moto and fakesnow before the cluster."""
    from runstate.services.spark_cluster import check_workers
    from runstate.services.state import ServiceError

    if workers:
        try:
            check_workers(workers)
        except ServiceError as error:
            raise click.BadParameter(str(error).removeprefix("spark: ")) from None
    return workers


@services.command()
def down() -> None:
    """Stop what `up` started (by pid; Spark daemons with their executors), never the machine's Postgres."""
    from runstate import services as svc

    stopped = svc.down(log=click.echo)
    click.echo(f"stopped {len(stopped)} service(s)")


@services.command()
def status() -> None:
    """Each service, its URL and whether it is healthy; exit code 1 when any is not."""
    from runstate import services as svc

    rows = svc.status()
    if not rows:
        click.echo("no services recorded: run `runstate services up`")
        sys.exit(1)
    for row in rows:
        pid = f"pid {row.pid}" if row.pid else "-"
        health = "healthy" if row.healthy else "UNHEALTHY"
        line = f"{row.name:<14} {row.kind:<8} {row.url:<45} {health:<9} {pid}"
        click.echo(f"{line}  {row.detail}".rstrip())
    if not all(row.healthy for row in rows):
        sys.exit(1)
