"""Dagster runs made by hand, for tests of what reads them."""

from __future__ import annotations

import dagster as dg


def started_run(
    on: dg.DagsterInstance, job: dg.JobDefinition, tags: dict[str, str] | None = None
) -> dg.DagsterRun:
    """A run of `job` that the instance `on` reads as STARTED, with no process behind it."""
    run = on.create_run_for_job(job, run_config={}, tags=tags)
    on.handle_run_event(
        run.run_id, dg.DagsterEvent(dg.DagsterEventType.RUN_START.value, job_name=run.job_name)
    )
    return on.get_run_by_id(run.run_id)
