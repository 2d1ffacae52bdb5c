"""`runstate maintenance submit|status|cancel|tick|sync|orchestrate` and `runstate health DB.TABLE`."""

from __future__ import annotations

import dataclasses
import functools
import json
from datetime import datetime
from typing import Any, Callable

import click

SENSOR_NAME = "maintenance_queue_sensor"


def _resource():
    from runstate.defs.maintenance import maintenance_resource

    return maintenance_resource()


def _spark():
    from runstate.spark import build_session, settings_from_runstate

    session = build_session(settings_from_runstate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def friendly_errors(command: Callable) -> Callable:
    """Bad input and unknown jobs/tables become one clear line, never a traceback."""
    from runstate.maintenance.store import JobNotFound, TableNotCached

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except TableNotCached as error:
            raise click.ClickException(f"{error}; run `runstate maintenance sync`") from None
        except (ValueError, JobNotFound, LookupError) as error:
            raise click.ClickException(str(error)) from None

    return wrapper


def _parse_option(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"{text!r} is not KEY=VALUE", param_hint="--option")
    try:
        return key, json.loads(raw)  # numbers and booleans; anything else stays text
    except ValueError:
        return key, raw


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(_jsonable(value), indent=2, sort_keys=True))


@click.group()
def maintenance() -> None:
    """Iceberg table maintenance: submit jobs, follow them, cancel them, drive the queue sensor."""


@maintenance.command()
@click.argument("table")
@click.option("--action", "-a", "actions", multiple=True, help="An action (repeatable, or comma-separated).")
@click.option("--dry-run", is_flag=True, help="Plan only: report what would be done, write nothing.")
@click.option("--option", "-o", "options", multiple=True, metavar="KEY=VALUE",
              help="Action option, e.g. rewrite_strategy=sort, sort_order='id DESC', retain_last=5.")
@friendly_errors
def submit(table: str, actions: tuple[str, ...], dry_run: bool, options: tuple[str, ...]) -> None:
    """Queue maintenance for TABLE (database.table); prints the job id (an active job's id if it has one)."""
    from runstate.maintenance.actions import ActionSettings
    from runstate.maintenance.identifiers import parse_table_ref, validate_actions

    ref = parse_table_ref(table)
    names = validate_actions(",".join(actions) if actions else
                             "rewrite_data_files,rewrite_position_delete_files,rewrite_manifests,expire_snapshots")
    parsed = dict(_parse_option(o) for o in options)
    resource = _resource()
    ActionSettings.from_options(parsed, resource.action_settings())  # validated before anything is written
    job_id = resource.get_store().submit(ref.database, ref.table, names, dry_run=dry_run, options=parsed)
    click.echo(job_id)


@maintenance.command()
@click.argument("job_id", required=False)
@click.option("--table", help="Only this table's jobs (database.table).")
@click.option("--limit", default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="JSON instead of text.")
@friendly_errors
def status(job_id: str | None, table: str | None, limit: int, as_json: bool) -> None:
    """One job with its action results, or the most recent jobs."""
    from runstate.maintenance.store import JobNotFound

    store = _resource().get_store()
    if job_id:
        job = store.get_job(job_id)
        if job is None:
            raise JobNotFound(f"maintenance job {job_id!r} not found")
        actions = store.job_actions(job_id)
        if as_json:
            _echo_json({"job": job, "actions": actions})
            return
        click.echo(f"{job.job_id} {job.table_key} {job.status}{' (dry run)' if job.dry_run else ''}"
                   f" submitted={job.submitted_at:%Y-%m-%d %H:%M:%S}")
        if job.error:
            click.echo(f"  error: {job.error}")
        for a in actions:
            mark = "ok " if a.success else "ERR"
            click.echo(f"  {mark} {a.action:<30} {a.elapsed_seconds:7.2f}s  {a.message or a.error or ''}")
        return
    jobs = store.list_jobs(table_key=table, limit=limit)
    if as_json:
        _echo_json(jobs)
        return
    for job in jobs:
        click.echo(f"{job.job_id} {job.table_key:<40} {job.status:<10} {','.join(job.actions)}")
    if not jobs:
        click.echo("no maintenance jobs")


@maintenance.command()
@click.argument("job_id")
@friendly_errors
def cancel(job_id: str) -> None:
    """Cancel a job: a pending one at once, a running one between its actions."""
    click.echo(f"{job_id} {_resource().get_store().cancel(job_id)}")


@maintenance.command()
def tick() -> None:
    """Evaluate maintenance_queue_sensor once and execute the iceberg_maintenance runs it requests, in-process."""
    import dagster as dg

    from runstate.defs.maintenance import build_defs
    from runstate.defs.shared import shared_definitions
    from runstate.defs.ticking import tick_sensor

    # Built now, not at import, so the resources follow the current settings (RUNSTATE_* variables).
    defs = dg.Definitions.merge(shared_definitions(), build_defs())
    result = tick_sensor(SENSOR_NAME, defs=defs)
    click.echo(f"requested {result.requested}, succeeded {result.succeeded}, failed {result.failed}"
               + (f", skipped: {result.skip_reason}" if result.skip_reason else ""))
    if result.failed:
        raise SystemExit(1)


@maintenance.command()
@friendly_errors
def sync() -> None:
    """Copy the `lake` catalog into the table cache (what the table_inventory asset does)."""
    from runstate.maintenance.catalog import list_tables

    listing = list_tables(_spark())
    stored = _resource().get_store().replace_table_cache([t.cached() for t in listing.tables])
    opted_in = sum(1 for t in listing.tables if t.maintenance_enabled)
    click.echo(f"cached {stored} tables ({opted_in} opted in)"
               + (f"; left out: {', '.join(listing.skipped)}" if listing.skipped else ""))


@maintenance.command()
@click.option("--dry-run", is_flag=True, help="Advisory only: record the assessment, submit nothing.")
@friendly_errors
def orchestrate(dry_run: bool) -> None:
    """One orchestrator pass over the table cache; prints its counters."""
    from runstate.maintenance.health import HealthAnalyzer
    from runstate.maintenance.orchestrator import Orchestrator

    resource = _resource()
    analyzer: list = []

    def analyze(ref):
        if not analyzer:
            analyzer.append(HealthAnalyzer(_spark(), resource.thresholds()))
        return analyzer[0].analyze(ref)

    report = Orchestrator(resource.get_store(), analyze, resource.orchestrator_settings(dry_run or None)).run()
    for d in report.decisions:
        click.echo(f"{d.table_key:<40} {d.decision:<22} {' '.join(d.recommended_actions)} {d.job_id or ''}".rstrip())
    click.echo(json.dumps(report.summary(), sort_keys=True))


@click.command()
@click.argument("table")
@click.option("--cached", is_flag=True, help="Show the latest stored report instead of analyzing now.")
@click.option("--no-record", is_flag=True, help="Do not store the fresh report in health_snapshots.")
@friendly_errors
def health(table: str, cached: bool, no_record: bool) -> None:
    """Health of TABLE (database.table) from its Iceberg metadata tables, as JSON."""
    from runstate.maintenance.health import HealthAnalyzer
    from runstate.maintenance.identifiers import parse_table_ref

    ref = parse_table_ref(table)
    resource = _resource()
    if cached:
        snapshot = resource.get_store().latest_health(ref.key)
        if snapshot is None:
            raise click.ClickException(f"no stored health for {ref.key}; run `runstate health {ref.key}`")
        _echo_json(snapshot)
        return
    report = HealthAnalyzer(_spark(), resource.thresholds()).analyze(ref)
    if not no_record:
        resource.get_store().insert_health_snapshot(report)
    _echo_json(report)


COMMANDS = [maintenance, health]
