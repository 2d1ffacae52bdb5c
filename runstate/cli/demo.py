"""`runstate demo`: the whole pipeline end to end, headless, with a printed summary."""

from __future__ import annotations

import sys
from typing import Any

import click

from runstate.config import load_env_file_into_environ, settings


@click.command()
@click.option(
    "--no-services", is_flag=True, help="Do not run `services up` first (use the configured endpoints)."
)
@click.option("--rows", type=int, default=40, show_default=True, help="WAL changes per dataset.")
@click.option("--files", type=int, default=60, show_default=True, help="Small data files per Iceberg table.")
def demo(no_services: bool, rows: int, files: int) -> None:
    """Seed runs, WAL changes and Iceberg tables; drive the sensors and schedules; print a summary."""
    # Imported here, not at the top: `runstate --help` lists this verb without loading the services.
    from tqdm import tqdm

    from runstate import services as svc

    try:
        if not no_services:
            svc.up(log=click.echo)
    except svc.ServiceError as exc:
        raise click.ClickException(str(exc)) from exc
    load_env_file_into_environ()
    settings.cache_clear()

    from runstate.commands.ticking import default_defs
    from runstate.demo import demo_instance, render, run_demo

    defs = default_defs()  # after the services wrote .env, so the resources follow it

    bars: dict[str, Any] = {}
    totals = {"workflow runs": 3, "WAL changes": 3 * rows, "Iceberg tables": 2}

    def progress(label: str, n: int) -> None:
        if label not in bars:
            bars[label] = tqdm(total=totals.get(label), desc=label, unit="", leave=True, file=sys.stderr)
        bars[label].update(n)

    with demo_instance() as instance:
        summary = run_demo(defs, instance, progress=progress, rows_per_dataset=rows, files_per_table=files)
    for bar in bars.values():
        bar.close()
    click.echo(render(summary))
    if summary.failed_runs:
        sys.exit(1)
