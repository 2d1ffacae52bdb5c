"""`runstate maintenance submit|status|cancel|tick|sync|orchestrate` and `runstate health [serve]`.

submit, status, cancel and `health --cached` touch only the core: they build the store from the
settings and import neither dagster nor pyspark, so they answer fast. Every error they can meet is a
MaintenanceError by the time it leaves the core, which the CLI's one error mapper prints as one line.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from runstate.maintenance.store import MaintenanceStore

MAX_OPTION_CHARS = 1000


def _store() -> MaintenanceStore:
    """The configured store; the schema is checked (`runstate db upgrade` migrates), never migrated here."""
    from runstate import wiring

    store = wiring.maintenance_store()
    click.get_current_context().call_on_close(store.close)  # the pool's threads end with the command
    wiring.require_schema("maintenance")
    return store


def _spark():
    from runstate import wiring

    session = wiring.spark_session()
    session.sparkContext.setLogLevel("ERROR")
    return session


def parse_option(text: str) -> tuple[str, Any]:
    """KEY=VALUE; VALUE as JSON when it parses (numbers, booleans), else as text."""
    from runstate.maintenance.errors import InvalidActionOption

    key, sep, raw = text.partition("=")
    if not sep or not key or len(text) > MAX_OPTION_CHARS:
        raise InvalidActionOption(
            f"option {text[:60]!r} is not KEY=VALUE (at most {MAX_OPTION_CHARS} characters)"
        )
    try:
        return key, json.loads(raw)
    except (ValueError, RecursionError):
        return key, raw


def _echo_json(value: Any) -> None:
    from runstate.maintenance.http import jsonable

    click.echo(json.dumps(jsonable(value), indent=2, sort_keys=True))


@click.group()
def maintenance() -> None:
    """Iceberg table maintenance: submit jobs, follow them, cancel them, drive the queue sensor."""


@maintenance.command()
@click.argument("table")
@click.option("--action", "-a", "actions", multiple=True, help="An action (repeatable, or comma-separated).")
@click.option("--dry-run", is_flag=True, help="Plan only: report what would be done, write nothing.")
@click.option(
    "--option",
    "-o",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Action option, e.g. rewrite_strategy=sort, sort_order='id DESC', retain_last=5.",
)
def submit(table: str, actions: tuple[str, ...], dry_run: bool, options: tuple[str, ...]) -> None:
    """Queue maintenance for TABLE (database.table); prints the job id (an active job's id if it has one)."""
    from runstate.maintenance.identifiers import DEFAULT_ACTIONS, parse_table_ref
    from runstate.maintenance.plan import ActionPlan

    ref = parse_table_ref(table)
    plan = ActionPlan.parse(
        ",".join(actions) if actions else DEFAULT_ACTIONS,
        dry_run=dry_run,
        options=dict(parse_option(o) for o in options),
    )
    click.echo(_store().queue.submit(ref, plan))


@maintenance.command()
@click.argument("job_id", required=False)
@click.option("--table", help="Only this table's jobs (database.table).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="JSON instead of text.")
def status(job_id: str | None, table: str | None, limit: int, as_json: bool) -> None:
    """One job with its action results, or the most recent jobs."""
    from runstate.maintenance.identifiers import parse_table_ref

    store = _store()
    if job_id:
        _show_job(store, job_id, as_json)
        return
    jobs = store.queue.list_jobs(table=parse_table_ref(table) if table is not None else None, limit=limit)
    if as_json:
        _echo_json(jobs)
        return
    for job in jobs:
        click.echo(f"{job.job_id} {job.table_key:<40} {job.status:<10} {','.join(job.actions)}")
    if not jobs:
        click.echo("no maintenance jobs")


def _show_job(store: MaintenanceStore, job_id: str, as_json: bool) -> None:
    from runstate.maintenance.errors import JobNotFound

    job = store.queue.get_job(job_id)
    if job is None:
        raise JobNotFound(f"maintenance job {job_id[:64]!r} not found")
    actions = store.queue.job_actions(job_id)
    if as_json:
        _echo_json({"job": job, "actions": actions})
        return
    click.echo(
        f"{job.job_id} {job.table_key} {job.status}{' (dry run)' if job.dry_run else ''}"
        f" submitted={job.submitted_at:%Y-%m-%d %H:%M:%S}"
    )
    if job.error:
        click.echo(f"  error: {job.error}")
    for a in actions:
        mark = "ok " if a.success else "ERR"
        click.echo(f"  {mark} {a.action:<30} {a.elapsed_seconds:7.2f}s  {a.message or a.error or ''}")


@maintenance.command()
@click.argument("job_id")
def cancel(job_id: str) -> None:
    """Cancel a job: a pending one at once, a running one between its actions."""
    click.echo(f"{job_id} {_store().cancel(job_id)}")


@maintenance.command()
@click.argument("job_id")
def delete(job_id: str) -> None:
    """Hide a job from `status` (cancelling it first when active); its row stays, marked deleted."""
    if not _store().queue.soft_delete(job_id):
        raise click.ClickException(f"job {job_id} is already deleted")
    click.echo(f"{job_id} deleted")


@maintenance.command()
def tick() -> None:
    """Evaluate maintenance_queue_sensor once and execute the worker runs it requests, in-process."""
    from runstate.commands.maintenance import tick_maintenance

    result = tick_maintenance()
    click.echo(
        f"requested {result.requested}, succeeded {result.succeeded}, failed {result.failed}"
        + (f", skipped: {result.skip_reason}" if result.skip_reason else "")
    )
    if result.failed:
        raise SystemExit(1)


@maintenance.command()
def sync() -> None:
    """Copy the `lake` catalog into the table cache (what the table_inventory asset does)."""
    from runstate.maintenance.catalog import list_tables

    listing = list_tables(_spark())
    stored = _store().cache.replace_table_cache([t.cached() for t in listing.tables])
    opted_in = sum(1 for t in listing.tables if t.maintenance_enabled)
    click.echo(
        f"cached {stored} tables ({opted_in} opted in)"
        + (f"; left out: {', '.join(listing.skipped)}" if listing.skipped else "")
    )


@maintenance.command()
@click.option("--dry-run", is_flag=True, help="Advisory only: record the assessment, submit nothing.")
def orchestrate(dry_run: bool) -> None:
    """One orchestrator pass over the table cache; prints its counters."""
    from runstate.maintenance.health import HealthAnalyzer
    from runstate.maintenance.orchestrator import Orchestrator, OrchestratorSettings

    # Spark starts only when some table gets past the cheap skips.
    analyze = HealthAnalyzer(_spark).analyze
    report = Orchestrator(_store(), analyze, OrchestratorSettings(dry_run=dry_run)).run()
    for d in report.decisions:
        click.echo(
            f"{d.table_key:<40} {d.decision:<22} {' '.join(d.recommended_actions)} {d.job_id or ''}".rstrip()
        )
    click.echo(json.dumps(report.summary(), sort_keys=True))


class _HealthGroup(click.Group):
    """`runstate health DB.TABLE` reads one table; `runstate health serve` runs the HTTP endpoint."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["show", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_HealthGroup)
def health() -> None:
    """Health of Iceberg tables from their metadata tables, as JSON (DB.TABLE, or `serve`)."""


@health.command("show")
@click.argument("table")
@click.option("--cached", is_flag=True, help="Show the latest stored report instead of analyzing now.")
@click.option("--no-record", is_flag=True, help="Do not store the fresh report in health_snapshots.")
def show(table: str, cached: bool, no_record: bool) -> None:
    """Health of TABLE (database.table)."""
    from runstate.maintenance.http import health_json
    from runstate.maintenance.identifiers import parse_table_ref

    ref = parse_table_ref(table)
    if cached:
        snapshot = _store().history.latest_health(ref)
        if snapshot is None:
            raise click.ClickException(f"no stored health for {ref.key}; run `runstate health {ref.key}`")
        click.echo(health_json(snapshot))
        return
    from runstate.maintenance.health import HealthAnalyzer

    report = HealthAnalyzer(_spark()).analyze(ref)
    if not no_record:
        _store().history.insert_health_snapshot(report)
    click.echo(health_json(report))


@health.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address (loopback by default).")
@click.option("--port", default=8079, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--analysis-timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0.1, 3600),
    help="Seconds a request waits for an analysis (then 504, or 503 while another one runs).",
)
@click.option(
    "--max-threads",
    default=8,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Requests handled at once; the others wait to be accepted.",
)
def serve(host: str, port: int, analysis_timeout: float, max_threads: int) -> None:
    """Serve GET /tables/{database}/{table}/health (same JSON as `runstate health`)."""
    from runstate.cli import stop_if_signalled
    from runstate.maintenance.health import HealthAnalyzer
    from runstate.maintenance.http import make_server

    store = _store()
    analyzer = HealthAnalyzer(_spark)  # Spark starts with the first valid request, not before

    def analyze(ref):
        report = analyzer.analyze(ref)
        store.history.insert_health_snapshot(report)
        return report

    try:
        server = make_server(
            host,
            port,
            analyze,
            store.history.latest_health,
            analysis_timeout=analysis_timeout,
            max_threads=max_threads,
        )
    except OSError as exc:  # the port in use, an address not on this machine, a privileged port
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    click.echo(
        f"serving table health on http://{server.server_address[0]}:{server.server_address[1]}", err=True
    )
    # Called between polls (every 0.5 s): a stop whose one interrupt some code swallowed (a finalizer
    # that ran at that moment) still ends the server, where every later SIGTERM would be ignored.
    server.service_actions = stop_if_signalled
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
