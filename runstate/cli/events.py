"""`runstate events append|show|tail|project|resume|archive|restore|migrate`: the run state store
from the shell.

The verbs build the core store straight from the settings (no Dagster import: they answer in well
under two seconds). Bad input and store errors are EventStoreErrors, which the CLI's one error
mapper prints as a single line with exit code 1.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from runstate.cli import events_export
from runstate.cli.events_io import (
    MAX_FILE_EVENTS,
    event_to_json,
    format_table,
    load_json,
    open_store,
    parse_time,
    read_jsonl,
    short_json,
    validate_all,
)
from runstate.config import DEFAULT_ARCHIVE_AFTER_DAYS
from runstate.eventstore.feed import MAX_POLL_SECONDS

# Seqs and feed positions are bigints in the stores (a larger one was a driver error or a missing SQL
# function), and a page of events is read into memory at once.
BIGINT_MAX = (1 << 63) - 1
SEQ = click.IntRange(0, BIGINT_MAX)
MAX_PAGE = 100_000
PAGE = click.IntRange(1, MAX_PAGE)
MAX_ARCHIVE_AGE_DAYS = 36_500  # a century; a date before year 1 cannot be computed


@click.group()
def events() -> None:
    """The run state store: append, inspect, follow, project, resume, archive and migrate run events."""


@events.command()
@click.option("--run-id", help="The run the event(s) belong to (a JSONL line may name its own).")
@click.option("--type", "event_type", help="Event type, e.g. RunStarted, StepCompleted.")
@click.option("--step", "step_id", help="Step id.")
@click.option("--data", help="Event payload as JSON.")
@click.option("--emitted-at", help="ISO 8601 timestamp with a UTC offset (default: now).")
@click.option("--attempt", "logical_attempt_id", help="Logical attempt id.")
@click.option(
    "--expected-last-seq",
    type=SEQ,
    help="Optimistic concurrency: refuse unless the run is at this seq (one run only).",
)
@click.option(
    "--file",
    "jsonl",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSONL file of events (one JSON object per line); each run's events are appended as one batch.",
)
def append(
    run_id: str | None,
    event_type: str | None,
    step_id: str | None,
    data: str | None,
    emitted_at: str | None,
    logical_attempt_id: str | None,
    expected_last_seq: int | None,
    jsonl: Path | None,
) -> None:
    """Append one event (--run-id --type ...) and/or a JSONL file of events.

    The whole input is validated before the first write: one bad event anywhere writes nothing."""
    from runstate.eventstore import NewEvent

    batch: list[Any] = []
    if event_type is not None:
        if not run_id:
            raise click.UsageError("--type needs --run-id")
        batch.append(
            NewEvent(
                run_id=run_id,
                event_type=event_type,
                emitted_at=parse_time(emitted_at, run_id),
                data=load_json(data, "--data"),
                step_id=step_id,
                logical_attempt_id=logical_attempt_id,
            )
        )
    elif data is not None or step_id is not None:
        raise click.UsageError("--step/--data describe an event: give --type too")
    if jsonl is not None:
        batch.extend(read_jsonl(jsonl, run_id, room=MAX_FILE_EVENTS - len(batch)))
    if not batch:
        raise click.UsageError("nothing to append: give --run-id and --type, or --file")
    by_run: dict[str, list[Any]] = {}
    for event in batch:
        by_run.setdefault(event.run_id, []).append(event)
    if expected_last_seq is not None and len(by_run) > 1:
        raise click.UsageError("--expected-last-seq applies to one run; the input names several")
    validate_all(by_run)
    with open_store() as store:
        append_runs(store, by_run, expected_last_seq)


def append_runs(store: Any, by_run: dict[str, list[Any]], expected_last_seq: int | None) -> None:
    from runstate.eventstore import EventStoreError

    done: list[str] = []
    for rid, run_events in by_run.items():
        try:
            results = store.append_batch(rid, run_events, expected_last_seq=expected_last_seq)
        except EventStoreError as exc:
            if not done:
                raise
            # Earlier runs committed: say which, so the message is true (a rerun is safe: idempotent).
            raise EventStoreError(f"{exc} (runs already appended: {', '.join(map(repr, done))})") from exc
        done.append(rid)
        for event, result in zip(run_events, results):
            state = "duplicate" if result.idempotent else "appended"
            click.echo(f"{rid}  seq {result.run_seq:>6}  {event.event_type:<16} {state}")


@events.command()
@click.argument("run_id")
@click.option(
    "--after", "after_seq", type=SEQ, default=0, show_default=True, help="Show events after this run_seq."
)
@click.option("--limit", type=PAGE, default=100, show_default=True, help="At most this many events.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event instead of a table.")
def show(run_id: str, after_seq: int, limit: int, as_json: bool) -> None:
    """Print a run's events as a table (archived runs too)."""
    from runstate.eventstore.validation import check_run_id

    check_run_id(run_id)
    with open_store() as store:
        stored = store.fetch(run_id, after_seq=after_seq, limit=limit)
    if not stored:
        click.echo(f"run {run_id!r}: no events after seq {after_seq}")
        return
    if as_json:
        for event in stored:
            click.echo(json.dumps(event_to_json(event), sort_keys=True))
        return
    rows = [
        (
            str(e.run_seq),
            e.event_type,
            e.step_id or "",
            e.emitted_at.isoformat(timespec="seconds"),
            short_json(e.data),
        )
        for e in stored
    ]
    click.echo(format_table(("SEQ", "TYPE", "STEP", "EMITTED_AT", "DATA"), rows))


def _finite(value: float) -> float:
    # FloatRange lets NaN through (every comparison with it is false): a subscriber then spun.
    if not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of seconds")
    return value


@events.command()
@click.option(
    "--after",
    "after_position",
    type=SEQ,
    default=0,
    show_default=True,
    help="Start after this feed position.",
)
@click.option("--follow", is_flag=True, help="Keep waiting for new events (Ctrl-C to stop).")
@click.option(
    "--limit",
    type=PAGE,
    default=1000,
    show_default=True,
    help="Without --follow: at most this many events.",
)
@click.option(
    "--poll-seconds",
    type=click.FloatRange(min=0.05, max=MAX_POLL_SECONDS),
    default=1.0,
    show_default=True,
    callback=lambda _ctx, _param, value: _finite(value),
    help="With --follow: the longest wait between reads (notifications wake it sooner).",
)
def tail(after_position: int, follow: bool, limit: int, poll_seconds: float) -> None:
    """Print the global feed: every run's events in commit order, one JSON object per line."""
    with open_store() as store:
        events_out = (
            store.subscribe(after_position, poll_seconds=poll_seconds)
            if follow
            else store.fetch_all(after_position, limit)
        )
        try:
            for event in events_out:
                click.echo(json.dumps(event_to_json(event), sort_keys=True))
        except KeyboardInterrupt:
            pass


@events.command()
@click.argument("run_id", required=False)
@click.option(
    "--all", "all_runs", is_flag=True, help="Every run with new events (with --rebuild: every run)."
)
@click.option("--rebuild", is_flag=True, help="Fold from scratch instead of from the stored watermark.")
@click.option("--no-progress", is_flag=True, help="No progress bar (for logs and scripts).")
def project(run_id: str | None, all_runs: bool, rebuild: bool, no_progress: bool) -> None:
    """Project a run's snapshot and print it as JSON; with --all, backfill run_snapshots.

    A run that cannot be projected is reported on stderr and the backfill carries on; the exit code
    is then 1."""
    if bool(run_id) == all_runs:
        raise click.UsageError("give a RUN_ID or --all")
    with open_store() as store:
        if all_runs:
            totals, failed = _project_all(store, rebuild, no_progress)
            click.echo(json.dumps(totals, sort_keys=True))
            for failed_run, error in failed:
                click.echo(f"run {failed_run!r}: not projected: {error}", err=True)
            if failed:
                raise click.exceptions.Exit(1)
            return
        snapshot = store.rebuild(run_id) if rebuild else store.project(run_id)
    click.echo(json.dumps({**snapshot.to_dict(), "version": snapshot.version}, indent=2, sort_keys=True))


def _all_run_ids(store: Any, page: int = 1000) -> Iterator[str]:
    after = ""
    while run_ids := store.run_ids(after=after, limit=page):
        yield from run_ids
        after = run_ids[-1]


def _project_all(
    store: Any, rebuild: bool, no_progress: bool
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    from tqdm import tqdm

    run_ids = list(_all_run_ids(store)) if rebuild else store.stale_runs(limit=1_000_000)
    totals = {"runs_projected": 0, "runs_changed": 0, "events_applied": 0}
    failed: list[tuple[str, str]] = []
    desc = "rebuild" if rebuild else "project"
    with tqdm(run_ids, unit="run", desc=desc, disable=no_progress, file=sys.stderr) as bar:
        for run_id in bar:
            report = store.project_runs([run_id], rebuild=rebuild)
            totals["runs_projected"] += report.runs_projected
            totals["runs_changed"] += report.runs_changed
            totals["events_applied"] += report.events_applied
            failed.extend(report.failed)
    if failed:
        totals["runs_failed"] = len(failed)
    return totals, failed


@events.command()
@click.argument("run_id")
def resume(run_id: str) -> None:
    """Show where a run resumes from: the latest valid snapshot and the events after it."""
    with open_store() as store:
        point = store.resume(run_id)
    click.echo(
        f"run {run_id!r}: snapshot at seq {point.snapshot_seq} ({point.kind}), "
        f"{len(point.events)} event(s) to replay"
    )
    if point.fallbacks:
        click.echo(f"warning: {point.fallbacks} corrupt snapshot(s) skipped", err=True)
    if point.events:
        click.echo(f"replay seqs {point.events[0].run_seq}..{point.events[-1].run_seq}")
    if point.kind in ("projection", "none"):
        summary = point.run_snapshot(run_id)
        click.echo(
            f"status {summary.status}, {len(summary.steps)} step(s), last seq {summary.last_event_seq}"
        )


@events.command()
@click.option(
    "--older-than-days",
    type=click.IntRange(0, MAX_ARCHIVE_AGE_DAYS),
    default=DEFAULT_ARCHIVE_AFTER_DAYS,
    show_default=True,
    help="Archive runs completed before.",
)
def archive(older_than_days: int) -> None:
    """Move the events of completed runs older than N days to the archive (still readable).

    RUNSTATE_ARCHIVE_TO says where: the archive table in Postgres (default), or the run history in the
    lake, where a run's events leave Postgres only once the lake has every one of them."""
    with open_store() as store:
        moved = store.archive(older_than_days)
        where = " to the lake" if store.archive_to == "lake" else ""
    click.echo(f"archived {moved} event(s){where} of runs completed more than {older_than_days} day(s) ago")


@events.command()
@click.argument("run_id")
def restore(run_id: str) -> None:
    """Move an archived run's events back to the live table (from the archive table or the lake)."""
    with open_store() as store:
        moved = store.restore(run_id)
    click.echo(f"run {run_id!r}: restored {moved} event(s)" if moved else f"run {run_id!r}: nothing archived")


@events.command()
@click.option("--batch-size", type=PAGE, default=1000, show_default=True)
@click.option("--no-progress", is_flag=True, help="No progress bar (for logs).")
def migrate(batch_size: int, no_progress: bool) -> None:
    """Copy every event from Postgres to Snowflake: resumable, idempotent, verified by counts and
    checksums."""
    from tqdm import tqdm

    from runstate.eventstore import migrate_events

    with open_store("postgres") as source, open_store("snowflake") as target:
        with tqdm(unit="event", desc="migrate", disable=no_progress) as bar:
            report = migrate_events(source, target, batch_size=batch_size, progress=bar.update)
    click.echo(
        f"runs {report.runs}, events read {report.events_read}, written {report.events_written}, "
        f"already there {report.events_skipped}, verified {'yes' if report.verified else 'NO'}"
    )
    if not report.verified:
        for mismatch in report.mismatches[:20]:
            click.echo(f"  mismatch: {mismatch}", err=True)
        raise click.ClickException(f"migration not verified: {len(report.mismatches)} mismatch(es)")


events.add_command(events_export.export)
